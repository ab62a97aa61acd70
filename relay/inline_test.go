package relay

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/servicetest"
)

// TestSenderDelivers: a send delivers to its recipient's idle stream
// itself, in order, and the stream's goroutine stays asleep. Red without
// the flag that keeps the hub's callback from waking it (the goroutine
// looked once a send), and with senders delivering nothing.
func TestSenderDelivers(t *testing.T) {
	for _, ndjson := range []bool{false, true} {
		t.Run(fmt.Sprintf("ndjson=%v", ndjson), func(t *testing.T) {
			h := newHarness(t, nil)
			phone := h.register("home", "phone")
			laptop := h.register("home", "laptop")
			var looks, bySender atomic.Int64
			h.srv.hooks.streamLook = func() { looks.Add(1) }
			h.srv.hooks.senderDelivered = func(bool) { bySender.Add(1) }
			st := h.openStream(phone, "", ndjson)
			st.next()
			const n = 20
			for i := int64(1); i <= n; i++ {
				h.send(laptop, fmt.Sprint("m", i), []byte("hello"), "phone")
				ev := st.next()
				if a := ev.answer(t); len(a.Envelopes) != 1 || a.Envelopes[0].Seq != i || string(a.Envelopes[0].Payload) != "hello" || ev.ID != fmt.Sprint(i) {
					t.Fatalf("event %s %+v, want seq %d", ev.ID, a, i)
				}
			}
			// The first send may find the stream not yet waiting.
			if got := bySender.Load(); got < n-1 {
				t.Errorf("senders delivered %d of %d", got, n)
			}
			if got := looks.Load(); got > 3 {
				t.Errorf("the stream's goroutine looked for news %d times for %d sends", got, n)
			}
		})
	}
}

// TestSenderDeliveryNoLostWakeup: news that comes while a sender holds
// the stream, after it read the position, wakes the stream's goroutine.
// Red with the flag cleared after the delivery rather than before the
// look: the second send waited for the keep-alive.
func TestSenderDeliveryNoLostWakeup(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	laptop := h.token("home", "laptop")
	var seq, nested atomic.Int64
	send := func() {
		n := seq.Add(1)
		r, err := h.do(context.Background(), "POST", "/v1/send", laptop, map[string]any{"id": fmt.Sprint(n), "to": []string{"phone"}, "payload": []byte("x")})
		if err != nil || r.status != http.StatusAccepted {
			t.Errorf("send: %v %d %s", err, r.status, r.body)
		}
	}
	// A sender's delivery sends one more, which finds the stream held.
	h.srv.hooks.senderDelivered = func(bool) {
		nested.Add(1)
		send()
	}
	st := h.openStream(phone, "", false)
	st.next()
	rounds := 30
	if testing.Short() {
		rounds = 10
	}
	var got int64
	for range rounds {
		send()
		for got < seq.Load() {
			for _, e := range st.next().answer(t).Envelopes {
				if e.Seq != got+1 {
					t.Fatalf("seq %d after %d", e.Seq, got)
				}
				got = e.Seq
			}
		}
	}
	if nested.Load() == 0 {
		t.Fatal("no sender delivered: the test tested nothing")
	}
}

// TestSenderMeetsTheEnd: a stream superseded while a sender holds it (its
// hub callback then wakes nothing) still ends at once. Red without the
// sender's wake of the goroutine.
func TestSenderMeetsTheEnd(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	laptop := h.register("home", "laptop")
	var armed atomic.Bool
	took := make(chan struct{}, 1)
	h.srv.hooks.sendersTook = func() {
		if !armed.CompareAndSwap(true, false) {
			return
		}
		// A newer poll's registration, as its request would make it.
		w, err := h.srv.hub.Subscribe(context.Background(), device.KeyOf("home", "phone"))
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(w.Close)
		took <- struct{}{}
	}
	st := h.openStream(phone, "", true)
	st.next()
	// Once the stream waits, the next send takes it.
	for i := 1; ; i++ {
		armed.Store(true)
		h.send(laptop, fmt.Sprint("m", i), []byte("x"), "phone")
		select {
		case <-took:
		default:
			t.Fatal("the send did not find the stream")
		}
		ev := st.next()
		if ev.Name == "envelopes" {
			continue // delivered before the stream waited; again
		}
		if b := ev.end(t); b.Reason != streamSuperseded {
			t.Fatalf("ended %+v, want superseded", b)
		}
		break
	}
	st.closedAfter()
}

// TestSenderNeverWaitsForTheReader: a stream whose client stops reading
// delays no send. What the socket does not take at once the stream's
// goroutine writes, under the event's deadline; read later, every event
// is there, in order. Red with a sender's write that waits (the sends
// stalled, with a minute for the answer).
func TestSenderNeverWaitsForTheReader(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.AnswerTimeout = time.Minute })
	phone := h.register("home", "phone")
	laptop := h.register("home", "laptop")
	var handedBack atomic.Int64
	h.srv.hooks.senderDelivered = func(more bool) {
		if more {
			handedBack.Add(1)
		}
	}
	conn := stalledRequest(t, h, phone, "/v1/stream")
	br := bufio.NewReader(conn)
	// The head and the first event, then nothing read.
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line == "event: ready\n" {
			break
		}
	}
	// 4 KiB envelopes travel with their wakes: 100 of them are well past
	// what the kernel holds for a reader that does not read.
	const n = 100
	payload := []byte(strings.Repeat("p", 4<<10))
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for i := 1; i <= n; i++ {
			h.send(laptop, fmt.Sprint("m", i), payload, "phone")
		}
	}()
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("sends waited for a stream's reader")
	}
	if handedBack.Load() == 0 {
		t.Error("no sender handed an event's rest back: the socket took all")
	}
	var want int64 = 1
	for want <= n {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after seq %d: %v", want-1, err)
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var a pollResponse
		if err := json.Unmarshal([]byte(data), &a); err != nil {
			t.Fatalf("data %.80q: %v", data, err)
		}
		for _, e := range a.Envelopes {
			if e.Seq != want || len(e.Payload) != len(payload) {
				t.Fatalf("seq %d (%d bytes) where %d was due", e.Seq, len(e.Payload), want)
			}
			want++
		}
	}
}

// TestSenderDeliversBeforeRedis: with several relays, a send delivers to
// the stream it holds as soon as this relay's waiters were told, before
// Redis is: a Redis that does not answer delays the send, not the stream.
// Redis is paused until the sender's delivery, which resumes it. Red with
// the hub's LocalDone after its publish (the publish, to a paused Redis,
// failed first).
func TestSenderDeliversBeforeRedis(t *testing.T) {
	rs := servicetest.StartRedis(t)
	a, _ := fleetReplicas(t, rs.URL(), rs.URL())
	phone := a.register("home", "phone")
	laptop := a.register("home", "laptop")
	var paused, bySender atomic.Bool
	a.srv.hooks.senderDelivered = func(bool) {
		bySender.Store(true)
		if paused.CompareAndSwap(true, false) {
			rs.Resume()
		}
	}
	st := a.openStream(phone, "", false)
	st.next()
	// Until the stream waits and a sender delivers to it.
	for i := 1; !bySender.Load(); i++ {
		a.send(laptop, fmt.Sprint("m", i), []byte("x"), "phone")
		st.next()
	}
	paused.Store(true)
	rs.Pause()
	a.send(laptop, "paused", []byte("x"), "phone")
	if paused.CompareAndSwap(true, false) {
		rs.Resume()
		t.Fatal("no sender delivered the send made with Redis paused")
	}
	if ev := st.next(); ev.answer(t).Envelopes[0].ID != "paused" {
		t.Fatalf("event %+v", ev)
	}
	if got := testutil.ToFloat64(a.srv.metrics.signalErrors); got != 0 {
		t.Fatal("the publish failed: the stream was delivered to after it, with Redis still paused")
	}
}
