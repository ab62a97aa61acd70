package relay

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/memory"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/token"
)

// TestPollNoLostWakeup guards the order of the poll loop in poll.go: the
// waiter is registered (hub.Subscribe) BEFORE the poll's first read of the
// device's position (its head and cursor, from memory or the store), which
// decides whether there is anything to fetch. The test commits a send right
// after that read (afterFirstRead), thousands of times, and each poll must
// return the envelope at once.
//
// Moving the Subscribe call anywhere after that read makes this test fail
// on its first iteration: the read saw nothing pending, the signal found no
// waiter, and the poll sleeps out its wait and answers empty. That was
// tried; keep the order.
func TestPollNoLostWakeup(t *testing.T) {
	h := newHarness(t, nil)
	iterations := 2000
	if testing.Short() {
		iterations = 200
	}
	testNoLostWakeup(t, h, h, iterations)
}

// testNoLostWakeup polls on relay at and sends through relay from in the
// window between the poll's first read and its wait.
func testNoLostWakeup(t *testing.T, at, from *harness, iterations int) {
	phone := at.register("home", "phone")
	sender := from.token("home", "laptop")
	var seq int64
	at.srv.hooks.afterFirstRead = func(k device.Key) {
		// A real send through the API, committed and signalled while the
		// poll is between its read and its wait.
		r, err := from.do(context.Background(), "POST", "/v1/send", sender, map[string]any{"id": fmt.Sprint(seq + 1), "to": []string{"phone"}, "payload": []byte("x")})
		if err != nil || r.status != http.StatusAccepted {
			t.Errorf("send in the window: %v %d %s", err, r.status, r.body)
		}
	}
	for i := range iterations {
		start := time.Now()
		p := at.poll(phone, fmt.Sprintf("cursor=%d&wait=5", seq))
		if len(p.Envelopes) != 1 || p.Envelopes[0].Seq != seq+1 {
			t.Fatalf("iteration %d: poll answered %+v after %v: the wake-up was lost", i, p, time.Since(start))
		}
		seq = p.Cursor
	}
}

// TestHangupFreesWaiters holds 200 polls on a real listener, hangs every
// one of them up, and checks that every waiter is gone.
func TestHangupFreesWaiters(t *testing.T) {
	h := newHarness(t, nil)
	const n = 200
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	toks := make([]string, n)
	for i := range n {
		toks[i] = h.register("home", fmt.Sprint("d", i))
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := h.do(ctx, "GET", "/v1/poll?wait=60", toks[i], nil)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("poll %d ended with %v, want a hang-up", i, err)
			}
		}()
	}
	eventually(t, "200 held polls", func() bool { return h.srv.HeldPolls() == n })
	for i := range n {
		if !h.hub.Held(device.Key{Household: "home", Device: fmt.Sprint("d", i)}) {
			t.Fatalf("d%d holds no waiter", i)
		}
	}
	cancel()
	wg.Wait()
	eventually(t, "every waiter gone", func() bool { return h.srv.HeldPolls() == 0 })
	for i := range n {
		if h.hub.Held(device.Key{Household: "home", Device: fmt.Sprint("d", i)}) {
			t.Fatalf("d%d still holds a waiter after its client hung up", i)
		}
	}
}

// TestNewerPollSupersedes: a second poll for the same device makes the
// first answer at once, and the second one gets the next envelope.
func TestNewerPollSupersedes(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	first := heldPoll(h, phone, "wait=60")
	eventually(t, "first poll held", func() bool { return h.srv.HeldPolls() == 1 })
	second := heldPoll(h, phone, "wait=60")
	select {
	case p := <-first:
		if len(p.Envelopes) != 0 {
			t.Fatalf("superseded poll = %+v", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the older poll was not answered when a newer one arrived")
	}
	eventually(t, "second poll held", func() bool { return h.srv.HeldPolls() == 1 })
	h.send(phone, "m", []byte("x"), "phone")
	if p := <-second; len(p.Envelopes) != 1 {
		t.Fatalf("newer poll = %+v", p)
	}
}

// TestDrainAnswersHeldPolls: shutdown answers every held poll at once and
// refuses new ones with 503 unavailable.
func TestDrainAnswersHeldPolls(t *testing.T) {
	h := newHarness(t, nil)
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		tok := h.register("home", fmt.Sprint("d", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := h.do(context.Background(), "GET", "/v1/poll?wait=60", tok, nil)
			if err != nil || r.status != http.StatusOK {
				t.Errorf("held poll during drain: %v %d %s", err, r.status, r.body)
			}
		}()
	}
	eventually(t, "held polls", func() bool { return h.srv.HeldPolls() == n })
	h.srv.readiness.Drain()
	tok := h.token("home", "late")
	r := h.must("GET", "/v1/poll?wait=5", tok, nil, http.StatusServiceUnavailable)
	if r.errCode(t) != codeUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("late poll: %v %s", r.header, r.body)
	}
	h.must("GET", "/ready", "", nil, http.StatusServiceUnavailable)
	start := time.Now()
	h.shutdown()
	wg.Wait()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("drain took %v; held polls were not answered at once", d)
	}
}

// TestWaitRunsOut: a poll with nothing to read answers empty when its wait
// runs out, with the stored cursor.
func TestWaitRunsOut(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	h.send(phone, "m", []byte("x"), "phone")
	h.must("POST", "/v1/ack", phone, `{"cursor":1}`, http.StatusNoContent)
	p := h.poll(phone, "wait=1")
	if len(p.Envelopes) != 0 || p.Cursor != 1 || p.More {
		t.Fatalf("poll = %+v", p)
	}
}

// TestIdlePollsCostNoStore: a thousand devices whose held polls expire
// several times, with nothing sent, cost the store nothing per poll: no
// read and no write beyond the background batch that records their
// activity once. (Every poll used to read the store and often write it.)
func TestIdlePollsCostNoStore(t *testing.T) {
	h := newHarness(t, nil)
	const devices, rounds = 1000, 3
	toks := make([]string, devices)
	for i := range devices {
		toks[i] = h.register("home", fmt.Sprint("d", i))
	}
	calls := func() map[string]float64 {
		m := map[string]float64{}
		for _, op := range []string{"state", "ack", "ack_many", "fetch", "register", "send"} {
			m[op] = testutil.ToFloat64(h.srv.metrics.storeCalls.WithLabelValues(op))
		}
		return m
	}
	before := calls()
	var wg sync.WaitGroup
	for i := range devices {
		wg.Go(func() {
			for range rounds {
				r, err := h.do(context.Background(), "GET", "/v1/poll?cursor=0&wait=1", toks[i], nil)
				if err != nil || r.status != http.StatusOK {
					t.Errorf("poll: %v %d %s", err, r.status, r.body)
					return
				}
			}
		})
	}
	wg.Wait()
	h.srv.memory.Stop() // write what gathered, as at shutdown
	after := calls()
	for _, op := range []string{"state", "ack", "fetch", "register", "send"} {
		if d := after[op] - before[op]; d != 0 {
			t.Errorf("%d idle polls made %v store %s calls, want none", devices*rounds, d, op)
		}
	}
	// Activity is recorded at most once per device per minute, in
	// batches (here the registrations just recorded it).
	if d := after["ack_many"] - before["ack_many"]; d > 20 {
		t.Errorf("%d idle polls made %v ack_many calls, want at most a few batches", devices*rounds, d)
	}
}

// TestHoldIsJittered: an empty held poll answers at a random point in the
// last tenth of its wait (at most holdJitter early), so that polls that
// started together drift apart.
func TestHoldIsJittered(t *testing.T) {
	s := &Server{}
	for _, wait := range []time.Duration{time.Second, 20 * time.Second, 60 * time.Second} {
		early := min(wait/10, holdJitter)
		seen := map[time.Duration]bool{}
		for range 200 {
			start := time.Now()
			d := s.pollDeadline(wait).Sub(start)
			if d > wait || d < wait-early-time.Millisecond {
				t.Fatalf("wait %v: deadline after %v, want within the last %v", wait, d, early)
			}
			seen[d.Round(early/20)] = true
		}
		if len(seen) < 5 {
			t.Fatalf("wait %v: deadlines hardly vary: %v", wait, seen)
		}
	}
}

// TestShutdownBeforeServe: a Shutdown that comes before Serve has started
// (a signal in the first instant after start) makes Serve return at once
// instead of serving for ever. Without the shut flag Serve did not return
// (tried).
func TestShutdownBeforeServe(t *testing.T) {
	cfg := DefaultConfig()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cfg.IssuerKeys = []ed25519.PublicKey{pub}
	base := newHarness(t, nil)
	srv, err := New(cfg, Deps{Store: base.db, Hub: newLocalHub()})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve after Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		ln.Close()
		t.Fatal("Serve after Shutdown went on serving")
	}
}

// TestLiveDeliveryReadsNothing: a send to a poll held on the same relay is
// handed over from memory: the store is asked for the send, and no fetch.
func TestLiveDeliveryReadsNothing(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	laptop := h.register("home", "laptop")
	fetches := func() float64 { return testutil.ToFloat64(h.srv.metrics.storeCalls.WithLabelValues("fetch")) }
	before := fetches()
	for i := range 20 {
		held := heldPoll(h, phone, fmt.Sprintf("cursor=%d&wait=10", i))
		eventually(t, "the poll held", func() bool { return h.srv.HeldPolls() == 1 })
		h.send(laptop, fmt.Sprint("m", i), []byte(fmt.Sprint("payload ", i)), "phone")
		p := <-held
		if len(p.Envelopes) != 1 || p.Envelopes[0].Seq != int64(i+1) || string(p.Envelopes[0].Payload) != fmt.Sprint("payload ", i) || p.Envelopes[0].From != "laptop" {
			t.Fatalf("poll %d = %+v", i, p)
		}
	}
	if d := fetches() - before; d != 0 {
		t.Fatalf("20 live deliveries made %v fetches, want none", d)
	}
}

// TestLiveDeliveryKnowsTheDevicesLife: an envelope kept in memory from a
// device's earlier life (removed through another relay, the name
// registered again) is not handed to the new life's poll, which gets its
// own seq 1 from the store. With the life check in recent.get removed,
// the old envelope was served (tried).
func TestLiveDeliveryKnowsTheDevicesLife(t *testing.T) {
	a, b := replicas(t, servicetest.RedisURL(t), 2)
	b.register("home", "phone")
	laptop := b.register("home", "laptop")
	b.send(laptop, "old", []byte("the earlier life's"), "phone") // seq 1, kept on b
	admin := a.mint(token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
	a.must("DELETE", "/v1/devices/phone", admin, nil, http.StatusNoContent)
	fresh := a.mint(token.Claims{Household: "home", Device: "phone", IssuedAt: time.Now().Add(time.Second), Expires: time.Now().Add(time.Hour)})
	a.must("POST", "/v1/register", fresh, nil, http.StatusOK)
	eventually(t, "b hears of the removal", func() bool {
		life, ok := b.srv.memory.KnownLife(device.Key{Household: "home", Device: "phone"})
		return ok && !life.IsZero()
	})
	held := heldPoll(b, fresh, "cursor=0&wait=10")
	eventually(t, "the poll held", func() bool { return b.srv.HeldPolls() == 1 })
	a.send(a.token("home", "laptop"), "new", []byte("the new life's"), "phone")
	if p := <-held; len(p.Envelopes) != 1 || p.Envelopes[0].ID != "new" {
		t.Fatalf("the new life's poll = %+v", p)
	}
}

// TestWakeCarriesSmallEnvelopes: across relays, a small envelope travels
// with its wake and the relay holding the poll hands it over without a
// fetch; a large one is read from the store there.
func TestWakeCarriesSmallEnvelopes(t *testing.T) {
	a, b := replicas(t, servicetest.RedisURL(t), 2)
	phone := b.register("home", "phone")
	laptop := a.register("home", "laptop")
	fetches := func() float64 { return testutil.ToFloat64(b.srv.metrics.storeCalls.WithLabelValues("fetch")) }
	for i, size := range []int{100, memory.WakeEnvelopeMax, memory.WakeEnvelopeMax + 1} {
		before := fetches()
		held := heldPoll(b, phone, fmt.Sprintf("cursor=%d&wait=10", i))
		eventually(t, "the poll held", func() bool { return b.srv.HeldPolls() == 1 })
		payload := bytes.Repeat([]byte{byte('a' + i)}, size)
		a.send(laptop, fmt.Sprint("m", i), payload, "phone")
		p := <-held
		if len(p.Envelopes) != 1 || !bytes.Equal(p.Envelopes[0].Payload, payload) || p.Envelopes[0].From != "laptop" || p.Envelopes[0].ID != fmt.Sprint("m", i) {
			t.Fatalf("poll %d = %+v", i, p)
		}
		want := 0.0
		if size > memory.WakeEnvelopeMax {
			want = 1
		}
		if d := fetches() - before; d != want {
			t.Fatalf("a %d-byte envelope from another relay made %v fetches, want %v", size, d, want)
		}
	}
}
