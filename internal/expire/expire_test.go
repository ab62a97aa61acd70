package expire

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/store/sqlite"
)

// TestExpirer: envelopes older than the TTL disappear and are counted;
// younger ones stay, and the device's seqs go on above them.
func TestExpirer(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(t.TempDir(), "relay.db"), Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Register(ctx, store.RegisterParams{Household: "home", Device: "phone", Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	send := func(id string) store.SendResult {
		res, err := db.Send(ctx, store.SendParams{Household: "home", Sender: "laptop", ID: id, To: []string{"phone"}, Payload: []byte(id), Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	send("old")
	send("young")

	e, err := New(db, time.Hour, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Both envelopes are seconds old: nothing is due yet.
	if res, err := e.Once(ctx); err != nil || res.Envelopes != 0 {
		t.Fatalf("Once = %+v, %v", res, err)
	}
	// Two hours on, both are past the TTL.
	e.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if res, err := e.Once(ctx); err != nil || res.Envelopes != 2 {
		t.Fatalf("Once two hours on = %+v, %v", res, err)
	}
	if got := testutil.ToFloat64(e.envelopes); got != 2 {
		t.Fatalf("fn_expired_envelopes_total = %v", got)
	}
	if b, err := db.Fetch(ctx, store.FetchParams{Household: "home", Device: "phone"}); err != nil || len(b.Envelopes) != 0 {
		t.Fatalf("after expiry the device holds %+v, %v", b, err)
	}
	if res := send("next"); res.Deliveries[0].Seq != 3 {
		t.Fatalf("next envelope's seq = %d, want 3 (1 and 2 expired)", res.Deliveries[0].Seq)
	}
}

// TestExpirerStartStop: Start runs a pass at once; Stop ends the passes
// and returns once the goroutine is gone. With Stop not waiting for it
// this goes red (tried).
func TestExpirerStartStop(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(t.TempDir(), "relay.db"), Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	passes := &countingStore{Store: db, passed: make(chan struct{}, 1)}
	e, err := New(passes, time.Hour, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	<-passes.passed
	e.Stop()
	select {
	case <-e.done:
	default:
		t.Fatal("Stop returned before the passes ended")
	}
}

// countingStore tells of each expiry pass.
type countingStore struct {
	store.Store
	passed chan struct{}
}

func (c *countingStore) Expire(ctx context.Context, p store.ExpireParams) (store.ExpireResult, error) {
	res, err := c.Store.Expire(ctx, p)
	select {
	case c.passed <- struct{}{}:
	default:
	}
	return res, err
}
