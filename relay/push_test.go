package relay

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/push"
	"github.com/flamenet/relay/store"
)

// upFake is a UnifiedPush endpoint that records what it is sent, and can be
// told that a target is gone.
type upFake struct {
	srv   *httptest.Server
	mu    sync.Mutex
	got   map[string][]string // path -> bodies
	gone  map[string]bool
	calls chan string
}

func newUPFake(t *testing.T) *upFake {
	f := &upFake{got: map[string][]string{}, gone: map[string]bool{}, calls: make(chan string, 100)}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.got[r.URL.Path] = append(f.got[r.URL.Path], string(b))
		gone := f.gone[r.URL.Path]
		f.mu.Unlock()
		if gone {
			w.WriteHeader(http.StatusGone)
		} else {
			w.WriteHeader(http.StatusCreated)
		}
		f.calls <- r.URL.Path
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *upFake) count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.got[path])
}

// TestPushAfterSend: a send to a device that holds no poll makes exactly
// one push, a device holding a poll gets none, a gone target is cleared and
// gets no further pushes, and no push carries the payload.
func TestPushAfterSend(t *testing.T) {
	fake := newUPFake(t)
	h := newHarness(t, nil)
	q, err := push.New(push.Config{AllowPrivate: true}, func(ctx context.Context, j push.Job) {
		if err := h.db.ClearPush(ctx, j.Household, j.Device, j.Target); err != nil {
			t.Errorf("clear push: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close(context.Background())
	h.srv.push = q

	reg := func(dev string) string {
		tok := h.token("home", dev)
		h.must("POST", "/v1/register", tok, map[string]any{"push": map[string]string{"kind": "unifiedpush", "endpoint": fake.srv.URL + "/" + dev}}, http.StatusOK)
		return tok
	}
	phone, laptop := reg("phone"), reg("laptop")
	const secret = "secret-payload-marker"

	// The phone holds no poll: one push.
	h.send(laptop, "1", []byte(secret), "phone")
	if p := <-fake.calls; p != "/phone" {
		t.Fatalf("push went to %s", p)
	}

	// The laptop holds a poll: the send wakes it and pushes nothing.
	held := heldPoll(h, laptop, "wait=30")
	// Held as the push decision sees it: counted in HeldPolls is not yet
	// registered with the hub.
	eventually(t, "laptop poll held", func() bool { return h.srv.hub.Held(device.Key{Household: "home", Device: "laptop"}) })
	h.send(phone, "2", []byte(secret), "laptop")
	if p := <-held; len(p.Envelopes) != 1 {
		t.Fatalf("held poll = %+v", p)
	}

	// The phone's target goes away: the provider says 410, the relay
	// clears it, and later sends push nothing.
	fake.mu.Lock()
	fake.gone["/phone"] = true
	fake.mu.Unlock()
	h.send(laptop, "3", []byte(secret), "phone")
	<-fake.calls
	eventually(t, "push target cleared", func() bool {
		ds, err := h.db.Devices(context.Background(), store.ListParams{Household: "home", Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if d.Name == "phone" {
				return d.Push.Empty()
			}
		}
		return false
	})
	h.send(laptop, "4", []byte(secret), "phone")
	// A marker send to the laptop (no poll held now) proves the queue has
	// moved past send 4 by the time its push arrives.
	h.send(phone, "5", []byte(secret), "laptop")
	if p := <-fake.calls; p != "/laptop" {
		t.Fatalf("push went to %s after the target was cleared; phone %d laptop %d stats %+v", p, fake.count("/phone"), fake.count("/laptop"), q.Stats())
	}
	if n := fake.count("/phone"); n != 2 {
		t.Fatalf("phone got %d pushes, want 2 (send 1, and send 3 that found it gone)", n)
	}
	if n := fake.count("/laptop"); n != 1 {
		t.Fatalf("laptop got %d pushes, want 1 (none while its poll was held)", n)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	for path, bodies := range fake.got {
		for _, b := range bodies {
			if strings.Contains(b, secret) || strings.Contains(b, "c2VjcmV0") {
				t.Fatalf("push to %s carried the payload: %q", path, b)
			}
		}
	}
}

// TestRegisterRefusesPrivateEndpoint: without FN_PUSH_ALLOW_PRIVATE a
// UnifiedPush endpoint on a loopback or private address is a 400.
func TestRegisterRefusesPrivateEndpoint(t *testing.T) {
	h := newHarness(t, nil)
	q, err := push.New(push.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close(context.Background())
	h.srv.push = q
	tok := h.token("home", "phone")
	for _, ep := range []string{"http://127.0.0.1:9/x", "https://10.0.0.1/x", "http://localhost/x", "http://[::1]/x", "http://169.254.169.254/latest", "https://push.example/a b", "https://u:p@push.example/x"} {
		r := h.must("POST", "/v1/register", tok, map[string]any{"push": map[string]string{"kind": "unifiedpush", "endpoint": ep}}, http.StatusBadRequest)
		if r.errCode(t) != codeBadRequest {
			t.Fatalf("%s: %s", ep, r.body)
		}
	}
	// A kind with no provider configured would never be pushed: refused
	// at register, saying so.
	r := h.must("POST", "/v1/register", tok, map[string]any{"push": map[string]string{"kind": "apns", "endpoint": strings.Repeat("ab", 32)}}, http.StatusBadRequest)
	if r.errCode(t) != codeBadRequest || !strings.Contains(string(r.body), "not configured") {
		t.Fatalf("apns without a provider: %s", r.body)
	}
}

// TestPushAcrossRelays: with two relays, a device whose poll is held on one
// is not pushed for a send on the other; once its poll ended, it is pushed
// once, by the relay it was held on, not by both.
func TestPushAcrossRelays(t *testing.T) {
	fake := newUPFake(t)
	a, b := replicas(t, servicetest.RedisURL(t), 2)
	queues := map[string]*push.Queue{}
	for name, h := range map[string]*harness{"a": a, "b": b} {
		q, err := push.New(push.Config{AllowPrivate: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { q.Close(context.Background()) })
		h.srv.push = q
		queues[name] = q
	}
	phone := b.token("home", "phone")
	b.must("POST", "/v1/register", phone, map[string]any{"push": map[string]string{"kind": "unifiedpush", "endpoint": fake.srv.URL + "/phone"}}, http.StatusOK)
	laptop := a.register("home", "laptop")

	held := heldPoll(b, phone, "wait=30")
	eventually(t, "phone's poll held on b", func() bool { return b.srv.hub.Held(device.Key{Household: "home", Device: "phone"}) })
	a.send(laptop, "1", []byte("x"), "phone")
	if p := <-held; len(p.Envelopes) != 1 {
		t.Fatalf("held poll = %+v", p)
	}
	// a decided before its send was answered, b before it woke the poll.
	if na, nb := queues["a"].Stats().Attempted, queues["b"].Stats().Attempted; na != 0 || nb != 0 {
		t.Fatalf("pushes queued for a held device: a %d, b %d; want none", na, nb)
	}

	// No poll now; b still listens for the phone and pushes it.
	a.send(laptop, "2", []byte("x"), "phone")
	if p := <-fake.calls; p != "/phone" {
		t.Fatalf("push went to %s", p)
	}
	if na, nb := queues["a"].Stats().Attempted, queues["b"].Stats().Attempted; na != 0 || nb != 1 {
		t.Fatalf("pushes queued: a %d, b %d; want 0 and 1", na, nb)
	}
}
