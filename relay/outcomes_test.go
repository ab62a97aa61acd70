package relay

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/store/sqlite"
	"github.com/flamenet/relay/token"
	"github.com/flamenet/relay/wake/local"
)

// pollCounts reads fn_polls_total by outcome.
func pollCounts(h *harness) map[string]float64 {
	m := map[string]float64{}
	for _, o := range pollOutcomes {
		m[o] = testutil.ToFloat64(h.srv.metrics.polls.WithLabelValues(o))
	}
	return m
}

// countedOnce fails unless exactly one poll was counted between before and
// now, under want.
func countedOnce(t *testing.T, h *harness, before map[string]float64, want string) {
	t.Helper()
	after := pollCounts(h)
	for _, o := range pollOutcomes {
		d := after[o] - before[o]
		switch {
		case o == want && d != 1:
			t.Errorf("fn_polls_total{outcome=%q} moved by %v, want 1", o, d)
		case o != want && d != 0:
			t.Errorf("fn_polls_total{outcome=%q} moved by %v, want 0 (the poll was %s)", o, d, want)
		}
	}
}

// TestPollOutcomes: every poll is counted once, under why it ended, and
// only the relay's own failures count as outcome="error": refused tokens
// and other client mistakes are junk anyone can send.
func TestPollOutcomes(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	laptop := h.register("home", "laptop")
	forged := h.token("home", "phone")
	forged = forged[:len(forged)-4] + "AAAA" // a signature that does not verify

	cases := []struct {
		name   string
		tok    string
		query  string
		status int
		want   string
	}{
		{"no token", "", "wait=0", http.StatusUnauthorized, pollUnauthorized},
		{"bad signature", forged, "wait=0", http.StatusUnauthorized, pollUnauthorized},
		{"not a token", "junk", "wait=1", http.StatusUnauthorized, pollUnauthorized},
		{"bad query", phone, "wait=soon", http.StatusBadRequest, pollClientError},
		{"cursor ahead", phone, "cursor=99&wait=0", http.StatusConflict, pollClientError},
		{"nothing waiting", phone, "wait=0", http.StatusOK, pollEmpty},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := pollCounts(h)
			r, err := h.do(context.Background(), "GET", "/v1/poll?"+c.query, c.tok, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.status != c.status {
				t.Fatalf("status %d, want %d: %s", r.status, c.status, r.body)
			}
			countedOnce(t, h, before, c.want)
		})
	}

	t.Run("delivered", func(t *testing.T) {
		before := pollCounts(h)
		h.send(laptop, "m1", []byte("x"), "phone")
		if got := h.poll(phone, "wait=0"); len(got.Envelopes) != 1 {
			t.Fatalf("poll: %+v", got)
		}
		countedOnce(t, h, before, pollDelivered)
	})

	// A poll held when its device is removed answers 401: counted as
	// removed, not also as unauthorized or error.
	t.Run("removed while held", func(t *testing.T) {
		tablet := h.register("home", "tablet")
		before := pollCounts(h)
		done := make(chan reply, 1)
		go func() {
			r, _ := h.do(context.Background(), "GET", "/v1/poll?wait=30", tablet, nil)
			done <- r
		}()
		eventually(t, "the poll to be held", func() bool { return h.srv.HeldPolls() == 1 })
		admin := h.mint(token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
		h.must("DELETE", "/v1/devices/tablet", admin, nil, http.StatusNoContent)
		if r := <-done; r.status != http.StatusUnauthorized {
			t.Fatalf("held poll of a removed device: %d %s", r.status, r.body)
		}
		countedOnce(t, h, before, pollRemoved)
	})
}

// TestPollOverloadedIsNotAnError: a poll past FN_MAX_HELD_POLLS is a limit
// doing its job, counted apart from the relay's failures.
func TestPollOverloadedIsNotAnError(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxHeldPolls = 1 })
	phone, laptop := h.register("home", "phone"), h.register("home", "laptop")
	ctx, cancel := context.WithCancel(context.Background())
	held := make(chan struct{})
	go func() {
		defer close(held)
		_, _ = h.do(ctx, "GET", "/v1/poll?wait=30", phone, nil)
	}()
	eventually(t, "the poll to be held", func() bool { return h.srv.HeldPolls() == 1 })
	before := pollCounts(h)
	r, err := h.do(context.Background(), "GET", "/v1/poll?wait=30", laptop, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusServiceUnavailable || r.errCode(t) != codeOverloaded {
		t.Fatalf("poll past the cap: %d %s", r.status, r.body)
	}
	countedOnce(t, h, before, pollOverloaded)

	// The held poll's client hangs up: a hangup, not an error.
	before = pollCounts(h)
	cancel()
	<-held
	eventually(t, "the hangup to be counted", func() bool { return pollCounts(h)[pollHangup] == before[pollHangup]+1 })
	countedOnce(t, h, before, pollHangup)
}

// faultyStore fails or stalls the calls a poll and a send make first, on
// demand.
type faultyStore struct {
	store.Store
	mode    atomic.Int32
	entered chan struct{} // one value each time a call stalls
}

const (
	storePasses = iota
	storeFails
	storeStalls // until the caller's context ends
)

func (f *faultyStore) fault(ctx context.Context) error {
	switch f.mode.Load() {
	case storeFails:
		return fmt.Errorf("test: %w", store.ErrUnavailable)
	case storeStalls:
		f.entered <- struct{}{}
		<-ctx.Done()
		return fmt.Errorf("%w: %w", store.ErrUnavailable, ctx.Err())
	}
	return nil
}

func (f *faultyStore) State(ctx context.Context, household, device string) (store.DeviceState, error) {
	if err := f.fault(ctx); err != nil {
		return store.DeviceState{}, err
	}
	return f.Store.State(ctx, household, device)
}

func (f *faultyStore) Send(ctx context.Context, p store.SendParams) (store.SendResult, error) {
	if err := f.fault(ctx); err != nil {
		return store.SendResult{}, err
	}
	return f.Store.Send(ctx, p)
}

// TestRelayErrorsStillCount: a poll the store fails is outcome="error" and
// a send it fails is code 503; a client that hangs up while the store call
// runs is a hangup (polls) or 499 (sends), not the relay's failure.
func TestRelayErrorsStillCount(t *testing.T) {
	db, err := sqlite.Open(context.Background(), sqlite.Config{Path: filepath.Join(t.TempDir(), "relay.db"), Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	fs := &faultyStore{Store: db, entered: make(chan struct{}, 1)}
	h := newHarnessWith(t, Deps{Store: fs, Hub: local.New(nil)}, nil)
	laptop := h.register("home", "laptop")
	h.register("home", "phone")
	sends := func(code string) float64 { return testutil.ToFloat64(h.srv.metrics.sends.WithLabelValues(code)) }

	fs.mode.Store(storeFails)
	before := pollCounts(h)
	// A device never seen: its first poll reads its state from the store.
	if r := h.must("GET", "/v1/poll?wait=0", h.token("home", "new1"), nil, http.StatusServiceUnavailable); r.errCode(t) != codeUnavailable {
		t.Fatalf("poll with the store failing: %s", r.body)
	}
	countedOnce(t, h, before, pollError)
	h.must("POST", "/v1/send", laptop, map[string]any{"id": "s1", "to": []string{"phone"}, "payload": []byte("x")}, http.StatusServiceUnavailable)
	if got := sends("503"); got != 1 {
		t.Fatalf(`fn_sends_total{code="503"} = %v, want 1`, got)
	}

	fs.mode.Store(storeStalls)
	before = pollCounts(h)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _, _ = h.do(ctx, "GET", "/v1/poll?wait=0", h.token("home", "new2"), nil) }()
	<-fs.entered
	cancel()
	eventually(t, "the poll to be counted", func() bool { return pollCounts(h)[pollHangup] == before[pollHangup]+1 })
	countedOnce(t, h, before, pollHangup)

	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		_, _ = h.do(ctx, "POST", "/v1/send", laptop, map[string]any{"id": "s2", "to": []string{"phone"}, "payload": []byte("x")})
	}()
	<-fs.entered
	cancel()
	eventually(t, "the send to be counted", func() bool { return sends(sendClientGone) == 1 })
	if got := sends("503"); got != 1 {
		t.Fatalf(`a send whose client hung up was counted as 503 (%v), want only code 499`, got)
	}
	fs.mode.Store(storePasses)
}
