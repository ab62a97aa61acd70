package sqlite

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
)

// holdWriter takes the writer's only connection, so that the group writer
// blocks on it with the first job it took while the rest wait to be taken.
// The returned function gives the connection back.
func holdWriter(t *testing.T, db *DB) (release func()) {
	t.Helper()
	conn, err := db.writer.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { conn.Close() }) }
	t.Cleanup(release)
	return release
}

// waitWaiting waits until n callers wait for the group writer to take
// their jobs.
func waitWaiting(t *testing.T, db *DB, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for db.waiting.Load() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d callers waiting, want %d", db.waiting.Load(), n)
		}
		time.Sleep(time.Millisecond) // a bounded poll of a counter
	}
}

func registerAll(t *testing.T, db *DB, devices ...string) {
	t.Helper()
	for _, d := range devices {
		if _, err := db.Register(t.Context(), store.RegisterParams{Household: "h", Device: d, Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
}

type sendOutcome struct {
	res store.SendResult
	err error
}

// sendAll starts one send per params and waits until all but the first
// wait to be taken (the first is taken and blocked on the held writer).
func sendAll(t *testing.T, db *DB, ps []store.SendParams) []chan sendOutcome {
	t.Helper()
	outs := make([]chan sendOutcome, len(ps))
	before := db.writer.Stats().WaitCount
	for i, p := range ps {
		outs[i] = make(chan sendOutcome, 1)
		go func() {
			res, err := db.Send(context.Background(), p)
			outs[i] <- sendOutcome{res, err}
		}()
		if i == 0 {
			waitTaken(t, db, before)
		}
	}
	waitWaiting(t, db, int64(len(ps)-1))
	return outs
}

// waitTaken waits until the group writer took a job and waits for the
// held connection: the writer pool's count of waits, which stood at
// before, goes up.
func waitTaken(t *testing.T, db *DB, before int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for db.writer.Stats().WaitCount == before {
		if time.Now().After(deadline) {
			t.Fatal("the group writer never asked for the connection")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestGroupKeepsEachOutcome runs sixteen sends in one group, one of them
// refused: the refused one is undone alone, the others commit with dense
// seqs, in one transaction.
//
// The guard is the rollback to the job's savepoint: without it (the
// refused send's claim of its id left in the group's transaction), this
// test failed: the refused id, sent again, came back as a Repeat with no
// deliveries (checked once by hand).
func TestGroupKeepsEachOutcome(t *testing.T) {
	db := openTB(t, tempPath(t))
	defer db.Close()
	registerAll(t, db, "a", "b", "full")
	if _, err := db.Send(t.Context(), store.SendParams{Household: "h", Sender: "x", ID: "fill", To: []string{"full"}, Payload: make([]byte, 100), Now: t0}); err != nil {
		t.Fatal(err)
	}
	groups := db.groups.Load()

	const n, refused = 16, 5
	ps := make([]store.SendParams, n)
	for i := range ps {
		ps[i] = store.SendParams{Household: "h", Sender: "x", ID: strconv.Itoa(i), To: []string{"a", "b"}, Payload: []byte("x"), Now: t0}
	}
	ps[refused].To, ps[refused].MaxPendingBytes = []string{"a", "b", "full"}, 100
	release := holdWriter(t, db)
	outs := sendAll(t, db, ps)
	release()

	seq := int64(0)
	for i, out := range outs {
		o := <-out
		if i == refused {
			var qe *store.QueueFullError
			if !errors.As(o.err, &qe) || qe.Device != "full" {
				t.Errorf("send %d = %v, want a QueueFullError for full", i, o.err)
			}
			continue
		}
		seq++
		if o.err != nil {
			t.Fatalf("send %d: %v", i, o.err)
		}
		// Jobs run in the order they were taken: the first, then the
		// waiting ones in the order the channel hands them over, which
		// need not be the order they started in. Seqs are checked below.
		if len(o.res.Deliveries) != 2 || o.res.Deliveries[0].Seq != o.res.Deliveries[1].Seq {
			t.Errorf("send %d = %+v, want the same seq on a and b", i, o.res.Deliveries)
		}
	}
	if got := db.groups.Load() - groups; got != 1 {
		t.Errorf("%d groups committed, want 1", got)
	}
	for _, d := range []string{"a", "b"} {
		b, err := db.Fetch(t.Context(), store.FetchParams{Household: "h", Device: d, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Envelopes) != n-1 {
			t.Fatalf("%s holds %d envelopes, want %d", d, len(b.Envelopes), n-1)
		}
		for i, e := range b.Envelopes {
			if e.Seq != int64(i+1) || e.ID == strconv.Itoa(refused) {
				t.Errorf("%s envelope %d = seq %d id %s", d, i, e.Seq, e.ID)
			}
		}
	}
	// Nothing of the refused send stayed: its id is free.
	p := ps[refused]
	p.MaxPendingBytes = 0
	res, err := db.Send(t.Context(), p)
	if err != nil || res.Repeat || len(res.Deliveries) != 3 || res.Deliveries[0].Seq != n {
		t.Errorf("the refused id sent again = %+v, %v; want a new send at a:%d", res, err, n)
	}
}

// TestGroupCommitFails makes the group's COMMIT fail (a deferred foreign
// key that only COMMIT checks, broken by one of the sends through a
// trigger): every send of the group fails and none is stored.
func TestGroupCommitFails(t *testing.T) {
	db := openTB(t, tempPath(t))
	defer db.Close()
	registerAll(t, db, "a", "b")
	for _, sql := range []string{
		`CREATE TABLE poison_parent (id INTEGER PRIMARY KEY)`,
		`CREATE TABLE poison (parent INTEGER REFERENCES poison_parent (id) DEFERRABLE INITIALLY DEFERRED)`,
		`CREATE TRIGGER poison_on_send AFTER INSERT ON envelopes WHEN NEW.send_id = 'poison'
		 BEGIN INSERT INTO poison VALUES (42); END`,
	} {
		if _, err := db.writer.ExecContext(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	const n = 6
	ps := make([]store.SendParams, n)
	for i := range ps {
		ps[i] = store.SendParams{Household: "h", Sender: "x", ID: strconv.Itoa(i), To: []string{"a", "b"}, Payload: []byte("x"), Now: t0}
	}
	ps[3].ID = "poison"
	release := holdWriter(t, db)
	outs := sendAll(t, db, ps)
	release()
	for i, out := range outs {
		// The commit's own error: the deferred key checked at COMMIT.
		if o := <-out; o.err == nil || !strings.Contains(o.err.Error(), "FOREIGN KEY") {
			t.Errorf("send %d of a group whose commit failed = %+v, %v; want the commit's error", i, o.res, o.err)
		}
	}
	for _, d := range []string{"a", "b"} {
		st, err := db.State(t.Context(), "h", d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Head != 0 {
			t.Errorf("%s head = %d after the failed commit, want 0", d, st.Head)
		}
	}
	// The writer is clean again: the same sends, without the poison, go
	// through as first sends.
	for _, p := range ps {
		if p.ID == "poison" {
			continue
		}
		res, err := db.Send(t.Context(), p)
		if err != nil || res.Repeat {
			t.Errorf("send %s again = %+v, %v, want a first send", p.ID, res, err)
		}
	}
}

// TestGroupCallerGoesAway: a caller whose ctx ends while its job waits to
// be taken gets its ctx error and stores nothing; a caller whose job was
// taken gets what the commit says, even if its ctx ended since.
func TestGroupCallerGoesAway(t *testing.T) {
	db := openTB(t, tempPath(t))
	defer db.Close()
	registerAll(t, db, "a")
	release := holdWriter(t, db)
	before := db.writer.Stats().WaitCount

	takenCtx, cancelTaken := context.WithCancel(t.Context())
	taken := make(chan sendOutcome, 1)
	go func() {
		res, err := db.Send(takenCtx, store.SendParams{Household: "h", Sender: "x", ID: "taken", To: []string{"a"}, Payload: []byte("x"), Now: t0})
		taken <- sendOutcome{res, err}
	}()
	waitTaken(t, db, before)

	waitingCtx, cancelWaiting := context.WithCancel(t.Context())
	waiting := make(chan error, 1)
	go func() {
		_, err := db.Send(waitingCtx, store.SendParams{Household: "h", Sender: "x", ID: "waiting", To: []string{"a"}, Payload: []byte("x"), Now: t0})
		waiting <- err
	}()
	waitWaiting(t, db, 1)
	cancelWaiting()
	if err := <-waiting; !errors.Is(err, context.Canceled) {
		t.Errorf("a waiting send whose ctx ended = %v, want context.Canceled", err)
	}
	cancelTaken()
	release()
	if o := <-taken; o.err != nil || o.res.Deliveries[0].Seq != 1 {
		t.Errorf("a taken send whose ctx ended since = %+v, %v, want it stored at seq 1", o.res, o.err)
	}
	b, err := db.Fetch(t.Context(), store.FetchParams{Household: "h", Device: "a", Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Envelopes) != 1 || b.Envelopes[0].ID != "taken" {
		t.Errorf("a holds %+v, want only the taken send", b.Envelopes)
	}
}

// TestGroupBounds: more jobs waiting than a group may hold commit in
// several groups.
func TestGroupBounds(t *testing.T) {
	db := openTB(t, tempPath(t))
	defer db.Close()
	registerAll(t, db, "a")
	groups := db.groups.Load()
	ps := make([]store.SendParams, maxGroupJobs+6)
	for i := range ps {
		ps[i] = store.SendParams{Household: "h", Sender: "x", ID: strconv.Itoa(i), To: []string{"a"}, Payload: []byte("x"), Now: t0}
	}
	release := holdWriter(t, db)
	outs := sendAll(t, db, ps)
	release()
	for i, out := range outs {
		if o := <-out; o.err != nil {
			t.Fatalf("send %d: %v", i, o.err)
		}
	}
	if got := db.groups.Load() - groups; got != 2 {
		t.Errorf("%d sends committed in %d groups, want 2 (at most %d a group)", len(ps), got, maxGroupJobs)
	}

	// Payload bytes: two sends that together exceed the bound go in two
	// groups.
	groups = db.groups.Load()
	big := make([]byte, maxGroupBytes/2+1)
	ps = []store.SendParams{
		{Household: "h", Sender: "x", ID: "big1", To: []string{"a"}, Payload: big, Now: t0},
		{Household: "h", Sender: "x", ID: "big2", To: []string{"a"}, Payload: big, Now: t0},
	}
	release = holdWriter(t, db)
	outs = sendAll(t, db, ps)
	release()
	for i, out := range outs {
		if o := <-out; o.err != nil {
			t.Fatalf("big send %d: %v", i, o.err)
		}
	}
	if got := db.groups.Load() - groups; got != 2 {
		t.Errorf("two sends of %d bytes committed in %d groups, want 2", len(big), got)
	}
}

// TestCloseWithJobsWaiting: Close lets the group in progress commit and
// refuses the jobs still waiting.
func TestCloseWithJobsWaiting(t *testing.T) {
	db := openTB(t, tempPath(t))
	registerAll(t, db, "a")
	ps := make([]store.SendParams, 3)
	for i := range ps {
		ps[i] = store.SendParams{Household: "h", Sender: "x", ID: strconv.Itoa(i), To: []string{"a"}, Payload: []byte("x"), Now: t0}
	}
	release := holdWriter(t, db)
	outs := sendAll(t, db, ps)
	closed := make(chan error, 1)
	go func() { closed <- db.Close() }()
	for i, out := range outs[1:] {
		if o := <-out; !errors.Is(o.err, errClosed) {
			t.Errorf("waiting send %d = %v, want errClosed", i+1, o.err)
		}
	}
	release()
	if o := <-outs[0]; o.err != nil {
		t.Errorf("the send in progress = %v, want it committed", o.err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if _, err := db.Send(t.Context(), ps[0]); err == nil {
		t.Error("Send after Close succeeded")
	}
}

// TestGroupDiscardsDirtyConnection leaves the writer connection inside a
// transaction, as a failed COMMIT elsewhere could: the next group cannot
// begin and fails its send, and the one after runs on a fresh connection.
//
// The guard is discarding the connection when BEGIN fails: without it,
// every later send failed with "cannot start a transaction within a
// transaction" (checked once by hand).
func TestGroupDiscardsDirtyConnection(t *testing.T) {
	db := openTB(t, tempPath(t))
	defer db.Close()
	registerAll(t, db, "a")
	conn, err := db.writer.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(t.Context(), "BEGIN"); err != nil {
		t.Fatal(err)
	}
	conn.Close() // back to the pool, still inside its transaction

	p := store.SendParams{Household: "h", Sender: "x", ID: "1", To: []string{"a"}, Payload: []byte("x"), Now: t0}
	if _, err := db.Send(t.Context(), p); err == nil {
		t.Fatal("a send on a connection inside a transaction succeeded")
	}
	res, err := db.Send(t.Context(), p)
	if err != nil || res.Repeat || res.Deliveries[0].Seq != 1 {
		t.Fatalf("the next send = %+v, %v, want a first send at seq 1", res, err)
	}
}
