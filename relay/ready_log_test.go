package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/ready"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/store"
)

// flakyStore's probe fails while down is set.
type flakyStore struct {
	store.Store
	down atomic.Bool
}

func (f *flakyStore) Ping(ctx context.Context) error {
	if f.down.Load() {
		return fmt.Errorf("probe: %w", store.ErrUnavailable)
	}
	return f.Store.Ping(ctx)
}

// TestReadyLogsChanges: a load balancer probes /ready every few seconds;
// while the store is down the log says so once, and once more when it is
// back, not a line per probe. Red when every 503 of /ready was logged at
// ERROR.
func TestReadyLogsChanges(t *testing.T) {
	log := &servicetest.Buffer{}
	base := newHarness(t, nil)
	fs := &flakyStore{Store: base.db}
	h := newHarnessWith(t, Deps{Store: fs, Hub: newLocalHub(), Logger: slog.New(slog.NewJSONHandler(log, nil))}, nil)
	probe := func(want int) {
		t.Helper()
		r, err := h.do(context.Background(), "GET", "/ready", "", nil)
		if err != nil || r.status != want {
			t.Fatalf("/ready: %v %d, want %d", err, r.status, want)
		}
	}
	probe(http.StatusOK)
	fs.down.Store(true)
	time.Sleep(ready.TTL) // past the cached answer
	for i := range 6 {
		probe(http.StatusServiceUnavailable)
		if i == 2 {
			time.Sleep(ready.TTL) // the store is asked again: still down
		}
	}
	fs.down.Store(false)
	time.Sleep(ready.TTL)
	for range 3 {
		probe(http.StatusOK)
	}

	// The lines about readiness, and any warning or error.
	var said []string
	for line := range strings.Lines(log.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if msg := fmt.Sprint(m["msg"]); strings.Contains(msg, "ready") || m["level"] != "INFO" {
			said = append(said, fmt.Sprint(m["level"], " ", m["msg"]))
		}
	}
	want := []string{"ERROR not ready: the store's probe fails", "INFO ready again: the store's probe passes"}
	if !slices.Equal(said, want) {
		t.Fatalf("the log said\n%s\nwant\n%s", strings.Join(said, "\n"), strings.Join(want, "\n"))
	}
}
