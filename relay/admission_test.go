package relay

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

// gatedStore holds every Send until the gate opens, so a test can fill the
// in-flight limit deterministically. Everything else is the real store.
type gatedStore struct {
	store.Store
	entered chan struct{}
	gate    chan struct{}
}

func (g gatedStore) Send(ctx context.Context, p store.SendParams) (store.SendResult, error) {
	g.entered <- struct{}{}
	<-g.gate
	return g.Store.Send(ctx, p)
}

// TestAdmission floods sends past the in-flight limit and the token
// bucket: refused sends get 429 rate_limited with Retry-After values that
// differ, every accepted send is delivered, and none is lost.
func TestAdmission(t *testing.T) {
	const inflight, burst = 4, 40
	base := newHarness(t, nil)
	gs := gatedStore{Store: base.db, entered: make(chan struct{}, 1000), gate: make(chan struct{})}
	h := newHarnessWith(t, Deps{Store: gs, Hub: base.hub}, func(c *Config) {
		c.SendInflight, c.SendBurst, c.SendRate = inflight, burst, 0.001
	})
	phone := h.register("home", "phone")
	// The held sends go to devices of their own: sends to one device reach
	// the store one at a time (the per-device gate).
	for i := range inflight {
		h.register("home", fmt.Sprint("d", i))
	}

	var (
		mu          sync.Mutex
		accepted    = map[string]bool{}
		refused     int
		retryAfters = map[string]int{}
	)
	send := func(id, to string) {
		r, err := h.do(context.Background(), "POST", "/v1/send", phone, map[string]any{"id": id, "to": []string{to}, "payload": []byte(id)})
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch r.status {
		case http.StatusAccepted:
			accepted[id] = true
		case http.StatusTooManyRequests:
			if code := r.errCode(t); code != codeRateLimited {
				t.Errorf("429 with code %s", code)
			}
			ra := r.header.Get("Retry-After")
			if n, err := strconv.Atoi(ra); err != nil || n < 1 {
				t.Errorf("Retry-After %q", ra)
			}
			retryAfters[ra]++
			refused++
		default:
			t.Errorf("send %s: %d %s", id, r.status, r.body)
		}
	}

	// Fill the in-flight limit with sends held in the store.
	var wg sync.WaitGroup
	for i := range inflight {
		wg.Add(1)
		go func() { defer wg.Done(); send(fmt.Sprint("held", i), fmt.Sprint("d", i)) }()
	}
	for range inflight {
		<-gs.entered
	}
	// Everything now is refused for being in flight, at once.
	for i := range 20 {
		send(fmt.Sprint("over", i), "phone")
	}
	if got := testutil.ToFloat64(h.srv.metrics.refusals.WithLabelValues(refusedInflight)); got != 20 {
		t.Fatalf("in-flight refusals = %v, want 20", got)
	}
	close(gs.gate)
	wg.Wait()

	// Then a flood past the bucket: burst-inflight tokens are left.
	for i := range 200 {
		wg.Add(1)
		go func() { defer wg.Done(); send(fmt.Sprint("flood", i), "phone") }()
	}
	wg.Wait()
	// The concurrent flood meets both limits; the bucket caps the total.
	total := inflight + 20 + 200
	if len(accepted) > burst || len(accepted) <= inflight || len(accepted)+refused != total {
		t.Fatalf("accepted %d and refused %d of %d sends with a burst of %d", len(accepted), refused, total, burst)
	}
	byReason := testutil.ToFloat64(h.srv.metrics.refusals.WithLabelValues(refusedRate)) +
		testutil.ToFloat64(h.srv.metrics.refusals.WithLabelValues(refusedInflight))
	if int(byReason) != refused {
		t.Fatalf("refusals by reason add up to %v, want %d", byReason, refused)
	}
	if len(retryAfters) < 2 {
		t.Fatalf("every refusal said Retry-After %v: not jittered", retryAfters)
	}
	// Every accepted send is delivered, once; nothing refused is.
	got := map[string]bool{}
	for i := -1; i < inflight; i++ {
		tok := phone
		if i >= 0 {
			tok = h.token("home", fmt.Sprint("d", i))
		}
		var cursor int64
		for {
			p := h.poll(tok, fmt.Sprintf("cursor=%d", cursor))
			if len(p.Envelopes) == 0 {
				break
			}
			for _, e := range p.Envelopes {
				if got[e.ID] || !accepted[e.ID] {
					t.Fatalf("delivered %s twice or without accepting it", e.ID)
				}
				got[e.ID] = true
			}
			cursor = p.Cursor
		}
	}
	if len(got) != len(accepted) {
		t.Fatalf("delivered %d of %d accepted sends", len(got), len(accepted))
	}
}

// downStore is a gatedStore whose probe fails: the store stopped
// answering while sends wait in it.
type downStore struct{ gatedStore }

func (downStore) Ping(context.Context) error {
	return fmt.Errorf("probe: %w", store.ErrUnavailable)
}

// TestInflightWhileStoreDown: when sends fill the in-flight limit because
// the store stopped answering, the sends past it are refused with 503 and
// Retry-After, not 429: the client did not send too much. With the store
// answering its probe (TestAdmission) they are 429 send_inflight.
func TestInflightWhileStoreDown(t *testing.T) {
	const inflight = 2
	base := newHarness(t, nil)
	ds := downStore{gatedStore{Store: base.db, entered: make(chan struct{}, 100), gate: make(chan struct{})}}
	h := newHarnessWith(t, Deps{Store: ds, Hub: base.hub}, func(c *Config) { c.SendInflight = inflight })
	phone := h.register("home", "phone")
	for i := range inflight {
		h.register("home", fmt.Sprint("d", i))
	}
	var wg sync.WaitGroup
	for i := range inflight {
		wg.Go(func() {
			r, err := h.do(context.Background(), "POST", "/v1/send", phone, map[string]any{"id": fmt.Sprint("held", i), "to": []string{fmt.Sprint("d", i)}, "payload": []byte("x")})
			if err != nil || r.status != http.StatusAccepted {
				t.Errorf("held send: %v %+v", err, r)
			}
		})
	}
	for range inflight {
		<-ds.entered
	}
	r, err := h.do(context.Background(), "POST", "/v1/send", phone, map[string]any{"id": "over", "to": []string{"phone"}, "payload": []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusServiceUnavailable || r.errCode(t) != codeUnavailable {
		t.Errorf("send past the limit with the store down: %d %s, want 503 %s", r.status, r.body, codeUnavailable)
	}
	if n, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || n < 1 {
		t.Errorf("Retry-After %q", r.header.Get("Retry-After"))
	}
	close(ds.gate)
	wg.Wait()
}

// TestGates: a send takes its recipients' gates at once when they are
// free, waits for one another send holds, gets it when that send leaves,
// and is refused with errBusy when the wait runs out, holding none of the
// gates it had taken.
func TestGates(t *testing.T) {
	ctx := context.Background()
	g := &gates{}
	leaveA, err := g.enter(ctx, "h", []string{"a"}, time.Second)
	if err != nil {
		t.Fatalf("free gate: %v", err)
	}
	if _, err := g.enter(ctx, "h", []string{"0", "a"}, 20*time.Millisecond); err != errBusy {
		t.Fatalf("held gate: %v, want errBusy", err)
	}
	// "0" was taken before "a" refused the send: it is free again, even
	// for a send that may not wait at all.
	leave0, err := g.enter(ctx, "h", []string{"0"}, 0)
	if err != nil {
		t.Fatalf("gate released by a refused send: %v", err)
	}
	leave0()

	got := make(chan error, 1)
	var leaveWaiter func()
	go func() {
		var err error
		leaveWaiter, err = g.enter(ctx, "h", []string{"a"}, time.Minute)
		got <- err
	}()
	eventually(t, "the second send waits for the gate", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.m[device.Key{Household: "h", Device: "a"}].refs == 2
	})
	leaveA()
	if err := <-got; err != nil {
		t.Fatalf("waiting send: %v", err)
	}
	leaveWaiter()
	if n := len(g.m); n != 0 {
		t.Errorf("%d gates left after every send left", n)
	}
}

// TestDevicePollRate: a device whose polls do not move its cursor, faster
// than its bucket, is refused 429 with Retry-After and limit
// device_poll_rate; a poll that moves the cursor still passes, and another
// device of the same household is not touched. Without admitPoll in
// startPoll this goes red (tried): every poll answered 200.
func TestDevicePollRate(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.DevicePollRate, c.DevicePollBurst = 0.001, 5 })
	phone := h.register("home", "phone")
	tablet := h.register("home", "tablet")
	for range 5 {
		h.must("GET", "/v1/poll?cursor=0&wait=0", phone, nil, http.StatusOK)
	}
	r := h.must("GET", "/v1/poll?cursor=0&wait=0", phone, nil, http.StatusTooManyRequests)
	var e errorBody
	r.json(t, &e)
	if e.Error != codeRateLimited || e.Limit != limitDevicePollRate || r.header.Get("Retry-After") == "" {
		t.Fatalf("the sixth poll: %s (Retry-After %q)", r.body, r.header.Get("Retry-After"))
	}
	h.must("GET", "/v1/poll?cursor=0&wait=0", tablet, nil, http.StatusOK)
	h.send(tablet, "1", []byte("x"), "phone")
	h.must("GET", "/v1/poll?cursor=1&wait=0", phone, nil, http.StatusOK) // progress: free
	h.must("GET", "/v1/poll?cursor=1&wait=0", phone, nil, http.StatusTooManyRequests)
	if n := testutil.ToFloat64(h.srv.metrics.refusals.WithLabelValues(refusedDevicePollRate)); n != 2 {
		t.Fatalf("%v poll refusals counted, want 2", n)
	}
}
