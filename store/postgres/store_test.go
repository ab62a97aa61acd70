package postgres

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
)

// TestPingOwnConnection pings while every pooled connection is taken: Ping
// still answers, because it never waits for the pool.
//
// The guard is Ping's own connection: with db.pool.Ping in its place, this
// test failed on Ping's deadline (checked once by hand).
func TestPingOwnConnection(t *testing.T) {
	db := openDB(t, 2)
	ctx := testCtx(t)
	for range 2 {
		c, err := db.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := db.Ping(short); err != nil {
		t.Fatalf("Ping with the pool exhausted: %v", err)
	}
}

// TestAckWritesOnlyWhenNeeded watches the device row's xmin (the id of the
// transaction that last wrote it): an ack that moves nothing leaves it
// alone until last_seen is a minute old.
//
// The guard is Ack's early return: without it, this test failed on the
// first "no write" step (checked once by hand).
func TestAckWritesOnlyWhenNeeded(t *testing.T) {
	db := openDB(t, 2)
	register(t, db, "home", "a")
	ctx := testCtx(t)
	for _, id := range []string{"1", "2"} {
		if _, err := db.Send(ctx, store.SendParams{Household: "home", Sender: "a", ID: id, To: []string{"a"}, Payload: []byte("x"), Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
	xmin := func() string {
		t.Helper()
		var x string
		if err := db.pool.QueryRow(ctx, `SELECT xmin::text FROM devices WHERE household = 'home' AND name = 'a'`).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}

	steps := []struct {
		name   string
		cursor int64
		now    time.Time
		write  bool
		want   store.Position
	}{
		{"cursor moves", 1, t0, true, store.Position{Cursor: 1, Head: 2, Acked: 1}},
		{"same cursor", 1, t0.Add(10 * time.Second), false, store.Position{Cursor: 1, Head: 2}},
		{"position only", -1, t0.Add(20 * time.Second), false, store.Position{Cursor: 1, Head: 2}},
		{"below the cursor", 0, t0.Add(30 * time.Second), false, store.Position{Cursor: 1, Head: 2}},
		{"last_seen a minute old", 1, t0.Add(time.Minute), true, store.Position{Cursor: 1, Head: 2}},
		{"fresh again", -1, t0.Add(90 * time.Second), false, store.Position{Cursor: 1, Head: 2}},
		{"to head", 2, t0.Add(91 * time.Second), true, store.Position{Cursor: 2, Head: 2, Acked: 1}},
	}
	for _, st := range steps {
		before := xmin()
		got, err := db.Ack(ctx, store.AckParams{Household: "home", Device: "a", Cursor: st.cursor, Now: st.now})
		if err != nil {
			t.Fatalf("%s: Ack: %v", st.name, err)
		}
		if got.Epoch == "" {
			t.Errorf("%s: Ack = %+v names no epoch", st.name, got)
		}
		if got.Epoch = ""; got != st.want {
			t.Errorf("%s: Ack = %+v, want %+v", st.name, got, st.want)
		}
		if wrote := xmin() != before; wrote != st.write {
			t.Errorf("%s: wrote the row = %v, want %v", st.name, wrote, st.write)
		}
	}
	ds, err := db.Devices(ctx, store.ListParams{Household: "home"})
	if err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(91 * time.Second); !ds[0].LastSeen.Equal(want) {
		t.Errorf("LastSeen = %v, want %v", ds[0].LastSeen, want)
	}
	checkCounters(t, db)
}

// TestExpire deletes old envelopes in small batches and keeps the pending
// counters true, and deletes old send records with no envelope left,
// paging past older ones that still have one.
func TestExpire(t *testing.T) {
	db := openDB(t, 2)
	register(t, db, "home", "a", "b")
	register(t, db, "away", "a")
	ctx := testCtx(t)
	send := func(household, id string, to []string, at time.Time) {
		t.Helper()
		if _, err := db.Send(ctx, store.SendParams{Household: household, Sender: "s", ID: id, To: to, Payload: []byte(id), Now: at}); err != nil {
			t.Fatalf("send %s: %v", id, err)
		}
	}
	oldest, old, recent := t0, t0.Add(time.Hour), t0.Add(48*time.Hour)
	for i := range 7 {
		send("away", fmt.Sprint("unread", i), []string{"a"}, oldest) // never acked
		send("home", fmt.Sprint("read", i), []string{"a", "b"}, old)
	}
	send("home", "recent", []string{"a", "b"}, recent)
	for _, d := range []string{"a", "b"} {
		if _, err := db.Ack(ctx, store.AckParams{Household: "home", Device: d, Cursor: 7, Now: recent}); err != nil {
			t.Fatal(err)
		}
	}

	// The oldest records come first and still have envelopes: expiry must
	// page past them to the deletable ones behind.
	res, err := db.Expire(ctx, store.ExpireParams{SendsBefore: recent, Batch: 3})
	if err != nil {
		t.Fatal(err)
	}
	if want := (store.ExpireResult{Sends: 7}); res != want {
		t.Errorf("Expire(sends) = %+v, want %+v: the read ones only", res, want)
	}

	res, err = db.Expire(ctx, store.ExpireParams{EnvelopesBefore: old, SendsBefore: recent, Batch: 3})
	if err != nil {
		t.Fatal(err)
	}
	if want := (store.ExpireResult{Envelopes: 7, Sends: 7}); res != want {
		t.Errorf("Expire = %+v, want %+v", res, want)
	}
	checkCounters(t, db)
	for _, dev := range []struct {
		household, name string
		want            int
	}{{"home", "a", 1}, {"home", "b", 1}, {"away", "a", 0}} {
		b, err := db.Fetch(ctx, store.FetchParams{Household: dev.household, Device: dev.name, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Envelopes) != dev.want || dev.want == 1 && b.Envelopes[0].ID != "recent" {
			t.Errorf("%s/%s holds %d envelopes after expiry, want %d (the recent one)", dev.household, dev.name, len(b.Envelopes), dev.want)
		}
	}
	// The recent send is still a repeat; an expired id is free again.
	again, err := db.Send(ctx, store.SendParams{Household: "home", Sender: "s", ID: "recent", To: []string{"a", "b"}, Payload: []byte("recent"), Now: recent})
	if err != nil || !again.Repeat {
		t.Errorf("recent send again = %+v, %v, want a repeat", again, err)
	}
	fresh, err := db.Send(ctx, store.SendParams{Household: "away", Sender: "s", ID: "unread0", To: []string{"a"}, Payload: []byte("new"), Now: recent})
	if err != nil || fresh.Repeat {
		t.Errorf("expired id sent again = %+v, %v, want a new send", fresh, err)
	}
}

// TestPingKeepsItsConnection: a thousand Pings, 25 at a time, use one
// connection of their own (the server sees one session, not one per
// probe), and a Ping after that session was killed opens a new one and
// succeeds. Each Ping opened and closed a session of its own before, which
// let unauthenticated /ready probes exhaust the server's connections.
func TestPingKeepsItsConnection(t *testing.T) {
	db := openDB(t, 2)
	ctx := testCtx(t)
	if err := db.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	pid := db.probeConn.PgConn().PID()
	var wg sync.WaitGroup
	for range 25 {
		wg.Go(func() {
			for range 40 {
				if err := db.Ping(ctx); err != nil {
					t.Errorf("Ping: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := db.probeConn.PgConn().PID(); got != pid {
		t.Fatalf("the probe's session changed from %d to %d without a failure", pid, got)
	}
	if _, err := db.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	if err := db.Ping(ctx); err != nil {
		t.Fatalf("Ping after its session was killed: %v", err)
	}
	if got := db.probeConn.PgConn().PID(); got == pid {
		t.Fatal("the probe kept a killed session")
	}
}
