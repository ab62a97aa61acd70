package fleet

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flamenet/relay/store"
)

// fakeHub says whether its wake-ups flow and records Degrade.
type fakeHub struct {
	health   error
	degraded time.Time
}

func (h *fakeHub) Health() error           { return h.health }
func (h *fakeHub) Degrade(until time.Time) { h.degraded = until }

// reports answers ReportHealth with what the other relays said, and this
// relay's own report; err fails the call.
type reports struct {
	store.Store
	others []store.RelayHealth
	err    error
}

func (r *reports) ReportHealth(_ context.Context, h store.RelayHealth, _ time.Time) ([]store.RelayHealth, error) {
	if r.err != nil {
		return nil, r.err
	}
	return append([]store.RelayHealth{h}, r.others...), nil
}

var errCut = errors.New("redis unreachable")

func newWatch(st *reports, hub *fakeHub) (*Member, prometheus.Gauge) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "troubled"})
	return New(st, hub, slog.New(slog.DiscardHandler), g), g
}

// TestSickWhileOthersFlow: this relay's wake-ups fail while another's
// flow: after SickAfter, and not before, it is not ready; the fleet falls
// back while anyone is troubled. Without the othersOK condition in Ready
// this goes red in TestAllTroubledStayReady instead (tried).
func TestSickWhileOthersFlow(t *testing.T) {
	hub := &fakeHub{health: errCut}
	st := &reports{others: []store.RelayHealth{{ID: "other", WakesOK: true}}}
	w, troubled := newWatch(st, hub)
	t0 := time.Unix(1_800_000_000, 0)
	w.round(t0)
	if err := w.Ready(t0.Add(SickAfter / 2)); err != nil {
		t.Fatalf("not ready before SickAfter: %v", err)
	}
	w.round(t0.Add(SickAfter))
	if err := w.Ready(t0.Add(SickAfter)); err == nil {
		t.Fatal("ready after SickAfter of failing wake-ups while another relay's flow")
	}
	if got := testutil.ToFloat64(troubled); got != 1 {
		t.Fatalf("troubled = %v, want 1", got)
	}
	if !hub.degraded.After(t0.Add(SickAfter)) {
		t.Fatalf("no fallback while a relay is troubled: degraded until %v", hub.degraded)
	}
	hub.health = nil
	w.round(t0.Add(SickAfter + time.Second))
	if err := w.Ready(t0.Add(SickAfter + time.Second)); err != nil {
		t.Fatalf("still not ready once wake-ups flow: %v", err)
	}
}

// TestAllTroubledStayReady: when no relay's wake-ups flow (Redis is
// down), each stays ready and serves by re-reading the store.
func TestAllTroubledStayReady(t *testing.T) {
	hub := &fakeHub{health: errCut}
	st := &reports{others: []store.RelayHealth{{ID: "other", WakesOK: false}}}
	w, troubled := newWatch(st, hub)
	t0 := time.Unix(1_800_000_000, 0)
	w.round(t0)
	w.round(t0.Add(2 * SickAfter))
	if err := w.Ready(t0.Add(2 * SickAfter)); err != nil {
		t.Fatalf("not ready with every relay troubled: %v", err)
	}
	if got := testutil.ToFloat64(troubled); got != 2 {
		t.Fatalf("troubled = %v, want 2", got)
	}
}

// TestStoreErrorKeepsWhatWasLearned: a round whose report fails changes
// nothing learned from the others, but still tracks this relay's own
// health.
func TestStoreErrorKeepsWhatWasLearned(t *testing.T) {
	hub := &fakeHub{}
	st := &reports{others: []store.RelayHealth{{ID: "other", WakesOK: true}}}
	w, _ := newWatch(st, hub)
	t0 := time.Unix(1_800_000_000, 0)
	w.round(t0)
	hub.health, st.err = errCut, errors.New("store down")
	w.round(t0.Add(time.Second))
	if err := w.Ready(t0.Add(time.Second + SickAfter)); err == nil {
		t.Fatal("ready after SickAfter of failing wake-ups, the others last known to flow")
	}
}

// TestStartStop: the rounds run between Start and Stop.
func TestStartStop(t *testing.T) {
	w, _ := newWatch(&reports{}, &fakeHub{})
	w.every = time.Millisecond
	w.Start()
	w.Stop()
	select {
	case <-w.done:
	default:
		t.Fatal("Stop returned before the rounds ended")
	}
}

// records keeps the log records it is given.
type records struct {
	mu   sync.Mutex
	seen []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.seen = append(r.seen, rec)
	r.mu.Unlock()
	return nil
}

func (r *records) said() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s []string
	for _, rec := range r.seen {
		s = append(s, rec.Level.String()+" "+rec.Message)
	}
	return s
}

// TestReadyLogsChanges: /ready asks Ready at every probe; the log says
// once that this relay is not ready for its wake-ups, and once that they
// flow again, not at every probe (the relay's /ready no longer logs each
// 503).
func TestReadyLogsChanges(t *testing.T) {
	hub := &fakeHub{health: errCut}
	st := &reports{others: []store.RelayHealth{{ID: "other", WakesOK: true}}}
	log := &records{}
	w := New(st, hub, slog.New(log), prometheus.NewGauge(prometheus.GaugeOpts{Name: "troubled"}))
	t0 := time.Unix(1_800_000_000, 0)
	w.round(t0)
	for i := range 3 {
		if err := w.Ready(t0.Add(time.Duration(i) * time.Second)); err != nil {
			t.Fatalf("not ready before SickAfter: %v", err)
		}
	}
	w.round(t0.Add(SickAfter))
	for i := range 5 {
		if err := w.Ready(t0.Add(SickAfter + time.Duration(i)*time.Second)); err == nil {
			t.Fatal("ready after SickAfter of failing wake-ups while another relay's flow")
		}
	}
	hub.health = nil
	w.round(t0.Add(2 * SickAfter))
	for i := range 3 {
		if err := w.Ready(t0.Add(2*SickAfter + time.Duration(i)*time.Second)); err != nil {
			t.Fatalf("still not ready once wake-ups flow: %v", err)
		}
	}
	want := []string{"ERROR not ready: wake-ups fail here while other relays' flow", "INFO ready again: wake-ups flow here"}
	if got := log.said(); !slices.Equal(got, want) {
		t.Fatalf("the log said %q, want %q", got, want)
	}
}
