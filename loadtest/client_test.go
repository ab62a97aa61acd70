package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/internal/epochtest"
)

// TestErrorCounting: what the relay answers over real HTTP, through the
// client package, is named, retried and counted as refused or as an error
// as the tester's figures say.
func TestErrorCounting(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read whole, so that the server notices the client hanging up.
		io.Copy(io.Discard, r.Body)
		switch r.Header.Get("Authorization") {
		case "Bearer busy":
			w.Header().Set("Retry-After", "3")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"unavailable","message":"draining"}`))
		case "Bearer limited":
			w.Header().Set("Content-Type", "application/msgpack")
			w.WriteHeader(http.StatusTooManyRequests)
			// {"error":"rate_limited","limit":"household_send_rate"}
			w.Write([]byte("\x82\xa5error\xacrate_limited\xa5limit\xb3household_send_rate"))
		case "Bearer ahead":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			w.Write([]byte(`{"error":"cursor_ahead","message":"m","head":7}`))
		case "Bearer broken":
			http.Error(w, "boom", http.StatusInternalServerError)
		case "Bearer hangup":
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
		case "Bearer slow":
			<-r.Context().Done()
		}
	}))
	t.Cleanup(srv.Close)
	tr := newTransport(8, 1)
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 300 * time.Millisecond}
	for _, tt := range []struct {
		tok        string
		kind       string
		retryable  bool
		turnedAway bool
		backoff    time.Duration // at least
	}{
		{"busy", "send 503 unavailable", true, true, 3 * time.Second},
		{"limited", "send 429 rate_limited (household_send_rate)", false, true, 0},
		{"ahead", "send 409 cursor_ahead", false, false, 0},
		{"broken", "send 500", false, false, 0},
		{"hangup", "send transport", true, false, 0},
		{"slow", "send timeout", true, false, 0},
	} {
		t.Run(tt.tok, func(t *testing.T) {
			c, err := client.New(srv.URL, tt.tok, client.WithHTTPClient(hc), client.WithCodec(codec("msgpack")))
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.SendOnce(context.Background(), "id", []string{"r0"}, []byte("p"))
			if err == nil {
				t.Fatal("no error")
			}
			if got := errKind("send", err); got != tt.kind {
				t.Errorf("errKind = %q, want %q (%v)", got, tt.kind, err)
			}
			if got := retryable(err); got != tt.retryable {
				t.Errorf("retryable = %v, want %v", got, tt.retryable)
			}
			var e *client.Error
			if errors.As(err, &e) != (tt.kind != "send transport" && tt.kind != "send timeout") {
				t.Errorf("answer %v read as %+v", err, e)
			}
			r := testRunner(t, []string{srv.URL}, 1)
			now := time.Now()
			r.failure("send", 0, err, now, now)
			counted := r.counts.errors
			if tt.turnedAway {
				counted = r.counts.refused
			}
			if counted[tt.kind] != 1 || len(r.counts.refused)+len(r.counts.errors) != 1 || len(r.counts.retried) != 0 {
				t.Errorf("counted refused %v, errors %v, retried %v", r.counts.refused, r.counts.errors, r.counts.retried)
			}
			if want := tt.tok == "limited"; (r.counts.householdRefused == 1) != want {
				t.Errorf("household refusals %d", r.counts.householdRefused)
			}
			if d := retryWait(0, err); d < tt.backoff {
				t.Errorf("backoff %v, want at least the Retry-After %v", d, tt.backoff)
			}
			if tt.tok == "ahead" && (!e.CursorAhead() || e.Head != 7) {
				t.Errorf("cursor_ahead read as %+v", e)
			}
		})
	}
}

// TestResyncAfterRollback: a recipient's poll with the epoch of a store
// whose history went back since is answered 409 cursor_ahead; the tester
// counts it, polls once without cursor and epoch, counts the resync, and
// goes on in the new epoch. The envelope handed again after it is
// redelivered, not a duplicate; the one the rollback took before it
// arrived is lost. With explicit acks, a stale ack resyncs the same way.
func TestResyncAfterRollback(t *testing.T) {
	const epochA, epochB = "AAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBB"
	relay := epochtest.Start(t, epochA)
	r := testRunner(t, []string{relay.URL}, 1)
	p := r.pairs[0]
	r.sends = make([]sendRecord, 4)
	env := func(i int) epochtest.Envelope {
		return epochtest.Envelope{From: p.sender, ID: r.sendID(i), Payload: payload(r.sendID(i), r.cfg.payload)}
	}
	ctx := context.Background()
	if err := r.registerOne(ctx, p); err != nil || p.epoch != epochA {
		t.Fatalf("register: %v, epoch %q", err, p.epoch)
	}
	for i := range r.sends {
		r.sends[i] = sendRecord{pair: 0, outcome: accepted, seq: int64(i + 1), started: time.Now(), answered: time.Now()}
	}
	for i := range 2 {
		e := env(i)
		relay.Add(e.From, e.ID, e.Payload)
	}
	if _, err := r.pollOnce(ctx, p, 0); err != nil || p.cursor != 2 {
		t.Fatalf("poll: %v, cursor %d", err, p.cursor)
	}
	e := env(3)
	relay.Add(e.From, e.ID, e.Payload) // seq 4, lost with the rollback
	// The store keeps seq 1 and 2 but lost the ack of 2; send 2 is stored
	// anew at seq 3.
	relay.Rollback(2, 1, epochB, env(2))
	if _, err := r.pollOnce(ctx, p, 0); err == nil {
		t.Fatal("the poll in the old epoch was answered")
	}
	for range 2 {
		if _, err := r.pollOnce(ctx, p, 0); err != nil {
			t.Fatal(err)
		}
	}
	if p.cursor != 3 || p.epoch != epochB || r.counts.cursorAhead != 1 || r.counts.resyncs != 1 || len(r.counts.errors) != 0 {
		t.Fatalf("cursor %d epoch %q, cursor_ahead %d, resyncs %d, errors %v", p.cursor, p.epoch, r.counts.cursorAhead, r.counts.resyncs, r.counts.errors)
	}
	var sent []string
	for _, q := range relay.Requests() {
		c, e := "-", cmp.Or(q.Epoch, "-")
		if q.Cursor != nil {
			c = strconv.FormatInt(*q.Cursor, 10)
		}
		sent = append(sent, fmt.Sprintf("%s %s %s %d", q.Op, c, e, q.Status))
	}
	want := []string{"poll 0 " + epochA + " 0", "poll 2 " + epochA + " 409", "poll - - 0", "poll 3 " + epochB + " 0"}
	if !slices.Equal(sent, want) {
		t.Errorf("requests\n%q, want\n%q", sent, want)
	}
	v := check(r.sends, r.pairs, checkOpts{})
	if v.delivered != 3 || v.redelivered != 1 || v.duplicates != 0 || v.reordered != 0 || v.lost != 1 || len(v.errors) != 0 {
		t.Errorf("verdict %+v", v)
	}

	// Explicit acks: the ack in the old epoch is refused, and the next
	// poll leaves the epoch out.
	r.cfg.ackMode = "explicit"
	relay.Rollback(3, 3, epochA)
	l, _ := r.current(p)
	r.ack(ctx, p, l, client.Position{Cursor: 3, Epoch: epochB})
	if _, err := r.pollOnce(ctx, p, 0); err != nil {
		t.Fatal(err)
	}
	reqs := relay.Requests()
	if ack, poll := reqs[len(reqs)-2], reqs[len(reqs)-1]; ack.Op != "ack" || ack.Epoch != epochB || ack.Status != 409 || poll.Cursor != nil || poll.Epoch != "" {
		t.Errorf("ack %+v then poll %+v", ack, poll)
	}
	if p.epoch != epochA || r.counts.cursorAhead != 2 || r.counts.resyncs != 2 || len(r.counts.errors) != 0 {
		t.Errorf("epoch %q, cursor_ahead %d, resyncs %d, errors %v", p.epoch, r.counts.cursorAhead, r.counts.resyncs, r.counts.errors)
	}
}
