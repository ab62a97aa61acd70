package client_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/internal/epochtest"
)

const (
	epochA = "AAAAAAAAAAAAAAAA"
	epochB = "BBBBBBBBBBBBBBBB"
)

// stateLog keeps the states a client reports.
type stateLog struct {
	mu     sync.Mutex
	states []client.State
}

func (l *stateLog) add(s client.State) {
	l.mu.Lock()
	l.states = append(l.states, s)
	l.mu.Unlock()
}

func (l *stateLog) resyncs() []client.State {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []client.State
	for _, s := range l.states {
		if s.Kind == client.StateResynced {
			out = append(out, s)
		}
	}
	return out
}

// receive waits for n envelopes from got.
func receive(t *testing.T, got <-chan client.Envelope, done <-chan error, n int) []string {
	t.Helper()
	var ids []string
	for len(ids) < n {
		select {
		case e := <-got:
			ids = append(ids, e.ID)
		case err := <-done:
			t.Fatalf("Listen returned %v after %v", err, ids)
		case <-time.After(15 * time.Second):
			t.Fatalf("got %v, want %d envelopes", ids, n)
		}
	}
	return ids
}

// TestListenResyncsAfterRollback: the store's history goes back (epoch A
// to B) to a head of 3 and new sends take seqs 4 and 5 again, so the
// client's cursor 5 is not above the head: only the epoch it sends shows
// that the cursor names other envelopes. The relay answers 409
// cursor_ahead; Listen polls once without cursor and epoch, hands over
// the two new envelopes, persists cursor and epoch B together, sends B
// from then on, and reports the resync.
func TestListenResyncsAfterRollback(t *testing.T) {
	r := epochtest.Start(t, epochA)
	for _, id := range []string{"m1", "m2", "m3", "m4", "m5"} {
		r.Add("laptop", id, []byte(id))
	}
	var log stateLog
	c := newClient(t, r.URL, "t", client.WithWait(2), client.WithStateFunc(log.add))
	cursors := client.FileCursor(filepath.Join(t.TempDir(), "cursor"))
	ctx, cancel, got, done := listenOn(c, cursors)
	defer cancel()
	if ids := receive(t, got, done, 5); !slices.Equal(ids, []string{"m1", "m2", "m3", "m4", "m5"}) {
		t.Fatalf("handed over %v", ids)
	}
	// Learnt from the first answer and kept with the cursor.
	deadline := time.Now().Add(10 * time.Second)
	for p, _ := cursors.Load(ctx); p != (client.Position{Cursor: 5, Epoch: epochA}); p, _ = cursors.Load(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("saved %+v", p)
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of the file
	}

	r.Rollback(3, 3, epochB, epochtest.Envelope{From: "laptop", ID: "n4"}, epochtest.Envelope{From: "laptop", ID: "n5"})
	if ids := receive(t, got, done, 2); !slices.Equal(ids, []string{"n4", "n5"}) {
		t.Fatalf("after the rollback, handed over %v, want n4 n5", ids)
	}
	deadline = time.Now().Add(10 * time.Second)
	for p, _ := cursors.Load(ctx); p != (client.Position{Cursor: 5, Epoch: epochB}); p, _ = cursors.Load(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("saved %+v after the resync", p)
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of the file
	}
	// A poll with the new position, then stop.
	for !slices.ContainsFunc(r.Requests(), func(q epochtest.Request) bool { return q.Epoch == epochB }) {
		if time.Now().After(deadline) {
			t.Fatal("no poll in epoch B")
		}
		time.Sleep(5 * time.Millisecond) // bounded wait for the next poll
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	reqs := r.Requests()
	if reqs[0].Epoch != "" || reqs[0].Cursor == nil || *reqs[0].Cursor != 0 {
		t.Errorf("first poll %+v, want cursor 0 and no epoch", reqs[0])
	}
	conflict := slices.IndexFunc(reqs, func(q epochtest.Request) bool { return q.Status == 409 })
	if conflict < 0 || conflict+1 == len(reqs) {
		t.Fatalf("no 409 followed by a poll: %+v", reqs)
	}
	for _, q := range reqs[1:conflict] {
		if q.Epoch != epochA && q.Op == "poll" {
			t.Errorf("poll %+v before the rollback, want epoch A", q)
		}
	}
	resync := reqs[conflict+1]
	if resync.Cursor != nil || resync.Epoch != "" || resync.Status != 0 {
		t.Errorf("the poll after the 409 is %+v, want neither cursor nor epoch", resync)
	}
	for _, q := range reqs[conflict+2:] {
		if q.Epoch != epochB || q.Cursor == nil || *q.Cursor != 5 {
			t.Errorf("poll %+v after the resync, want cursor 5 in epoch B", q)
		}
	}
	rs := log.resyncs()
	var e *client.Error
	if len(rs) != 1 || rs[0].Position != (client.Position{Cursor: 5, Epoch: epochB}) || !errors.As(rs[0].Err, &e) || !e.CursorAhead() || e.Epoch != epochB {
		t.Errorf("resyncs reported: %+v", rs)
	}
}

// TestListenResyncRedelivers: a rollback that lost acknowledgements too
// hands envelopes over again after the resync, and nothing is skipped;
// the saved cursor without an epoch (a file written before epochs) is
// sent alone until an answer names the epoch.
func TestListenResyncRedelivers(t *testing.T) {
	r := epochtest.Start(t, epochA)
	for _, id := range []string{"m1", "m2", "m3", "m4"} {
		r.Add("laptop", id, []byte(id))
	}
	cursors := &client.MemoryCursor{}
	cursors.Save(context.Background(), client.Position{Cursor: 2})
	c := newClient(t, r.URL, "t", client.WithWait(2))
	ctx, cancel, got, done := listenOn(c, cursors)
	defer cancel()
	if ids := receive(t, got, done, 2); !slices.Equal(ids, []string{"m3", "m4"}) {
		t.Fatalf("handed over %v", ids)
	}
	// The store keeps m1..m4 but its cursor goes back to 1.
	r.Rollback(4, 1, epochB, epochtest.Envelope{From: "laptop", ID: "n5"})
	if ids := receive(t, got, done, 4); !slices.Equal(ids, []string{"m2", "m3", "m4", "n5"}) {
		t.Fatalf("after the rollback, handed over %v, want m2 m3 m4 n5", ids)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if p, _ := cursors.Load(ctx); p != (client.Position{Cursor: 5, Epoch: epochB}) {
		t.Errorf("saved %+v", p)
	}
	if q := r.Requests()[0]; q.Epoch != "" || q.Cursor == nil || *q.Cursor != 2 {
		t.Errorf("first poll %+v, want cursor 2 alone", q)
	}
}

// TestAckAndPollSendEpoch: Ack and Poll carry the epoch given, and a stale
// one is refused with the relay's current epoch, acknowledging nothing.
func TestAckAndPollSendEpoch(t *testing.T) {
	r := epochtest.Start(t, epochA)
	r.Add("laptop", "m1", nil)
	r.Add("laptop", "m2", nil)
	c := newClient(t, r.URL, "t")
	ctx := context.Background()
	reg, err := c.Register(ctx)
	if err != nil || reg.Epoch != epochA {
		t.Fatalf("register: %+v, %v", reg, err)
	}
	res, err := c.Poll(ctx, client.PollQuery{Cursor: 0, Epoch: reg.Epoch})
	if err != nil || res.Epoch != epochA || len(res.Envelopes) != 2 {
		t.Fatalf("poll: %+v, %v", res, err)
	}
	if err := c.Ack(ctx, client.Position{Cursor: 1, Epoch: res.Epoch}); err != nil {
		t.Fatal(err)
	}
	r.Rollback(2, 0, epochB)
	var e *client.Error
	if err := c.Ack(ctx, client.Position{Cursor: 2, Epoch: epochA}); !errors.As(err, &e) || !e.CursorAhead() || e.Epoch != epochB || e.Head != 2 {
		t.Fatalf("stale ack: %v (%+v)", err, e)
	}
	if _, err := c.Poll(ctx, client.PollQuery{Cursor: 0, Epoch: epochA}); !errors.As(err, &e) || !e.CursorAhead() || e.Epoch != epochB {
		t.Fatalf("stale poll: %v", err)
	}
	if r.Cursor() != 0 {
		t.Errorf("the stale requests acknowledged up to %d", r.Cursor())
	}
	var epochs []string
	for _, q := range r.Requests() {
		epochs = append(epochs, q.Op+" "+q.Epoch)
	}
	if want := []string{"poll " + epochA, "ack " + epochA, "ack " + epochA, "poll " + epochA}; !slices.Equal(epochs, want) {
		t.Errorf("requests %q, want %q", epochs, want)
	}
}
