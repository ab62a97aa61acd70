package postgres

import (
	"math"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/store/storetest"
)

// TestConcurrentAckMany runs the suite's ack-batch race on a pool of ten,
// so that batches, fan-outs, removals and expiry really run side by side,
// and then checks the counters against the rows.
//
// The guard is relay_ack_many's lock order, (household, name): with the
// rows locked in the batch's own order instead (ORDER BY the input's
// ordinality), this test failed with 40P01 deadlocks (checked once by
// hand).
func TestConcurrentAckMany(t *testing.T) {
	db := openDB(t, 10)
	storetest.ConcurrentAcks(t, db)
	checkCounters(t, db)
}

// blockedBy waits until some session waits for a lock that the session
// with pid holds.
func blockedBy(t *testing.T, db *DB, pid uint32) {
	t.Helper()
	ctx := testCtx(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, int32(pid)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("nobody waited for the held lock")
		}
		time.Sleep(5 * time.Millisecond) // a bounded poll of the server's own view
	}
}

// TestRepeatWaitsForClaim holds an identical send open after its claim, so
// that a second one waits on the unique key: once the first commits, the
// second must answer from the record it could not see when it started.
// relay_send reads the record in a statement of its own, which in READ
// COMMITTED takes a fresh snapshot.
//
// Broken on purpose once (the record read in the same statement as the
// claim, a CTE), this test failed: the read found nothing and the send
// answered ErrUnavailable ("record expired meanwhile"); so did
// TestConcurrentIdenticalSends.
func TestRepeatWaitsForClaim(t *testing.T) {
	db := openDB(t, 2)
	register(t, db, "home", "a", "b")
	ctx := testCtx(t)
	p := store.SendParams{Household: "home", Sender: "x", ID: "same", To: []string{"a", "b"}, Payload: []byte("once"), Now: t0}

	holder := schemaConn(t, db)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	sum := store.Digest(p.To, p.Payload)
	rows, err := tx.Query(ctx, sqlSend, p.Household, p.Sender, p.ID, sum[:], p.To, p.Payload, p.Now, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	type outcome struct {
		res store.SendResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := db.Send(ctx, p)
		done <- outcome{res, err}
	}()
	blockedBy(t, db, holder.PgConn().PID())
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil {
		t.Fatalf("the waiting send: %v", o.err)
	}
	if !o.res.Repeat || answer(o.res) != "a:1 b:1" {
		t.Errorf("the waiting send = %s (repeat %v), want the first's answer a:1 b:1 as a repeat", answer(o.res), o.res.Repeat)
	}
	for _, d := range o.res.Deliveries {
		if !d.Pending {
			t.Errorf("delivery %s not pending", d.Device)
		}
	}
}

// TestAckManySeesSendItWaitedFor holds a send to a open (its row locked,
// its envelope not committed) while a batch acks a far past its head. The
// batch waits for the row; once the send commits, the new cursor covers
// the new envelope (the head read under the lock), so the deletion must
// see that envelope too, or it would stay stored below the cursor, counted
// and never deleted by an ack.
//
// The guard is relay_ack_many's deletion in a statement of its own, after
// the locks: broken on purpose once (lock, deletion and update in one
// statement with one snapshot), this test failed: the batch deleted 1 of
// the 2 envelopes and left seq 2 stored below the cursor.
func TestAckManySeesSendItWaitedFor(t *testing.T) {
	db := openDB(t, 2)
	register(t, db, "home", "a")
	ctx := testCtx(t)
	if _, err := db.Send(ctx, store.SendParams{Household: "home", Sender: "x", ID: "1", To: []string{"a"}, Payload: []byte("x"), Now: t0}); err != nil {
		t.Fatal(err)
	}

	holder := schemaConn(t, db)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	sum := store.Digest([]string{"a"}, []byte("y"))
	rows, err := tx.Query(ctx, sqlSend, "home", "x", "2", sum[:], []string{"a"}, []byte("y"), t0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	var deleted int64
	go func() {
		var err error
		var res store.AckManyResult
		res, err = db.AckMany(ctx, []store.Ack{{Household: "home", Device: "a", Cursor: math.MaxInt64}})
		deleted = res.Deleted
		done <- err
	}()
	blockedBy(t, db, holder.PgConn().PID())
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if deleted != 2 {
		t.Errorf("AckMany deleted %d, want 2", deleted)
	}
	st, err := db.State(ctx, "home", "a")
	if err != nil {
		t.Fatal(err)
	}
	if st.Cursor != 2 || st.Head != 2 {
		t.Errorf("State = %+v, want cursor and head 2", st)
	}
	var left int
	if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM envelopes`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d envelopes left at or below the cursor", left)
	}
	checkCounters(t, db)
}

// TestAckManyWritesOnlyWhatMoves: a batch entry that moves neither the
// cursor nor last_seen leaves its row alone (no new row version), so that
// a batch of idle devices costs no writes.
func TestAckManyWritesOnlyWhatMoves(t *testing.T) {
	db := openDB(t, 2)
	register(t, db, "home", "a", "b")
	ctx := testCtx(t)
	xmin := func(name string) string {
		t.Helper()
		var x string
		if err := db.pool.QueryRow(ctx, `SELECT xmin::text FROM devices WHERE household = 'home' AND name = $1`, name).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	a, b := xmin("a"), xmin("b")
	if _, err := db.AckMany(ctx, []store.Ack{
		{Household: "home", Device: "a", Cursor: 0, Seen: t0.Add(-time.Hour)},
		{Household: "home", Device: "b", Cursor: -1, Seen: t0.Add(time.Hour)},
	}); err != nil {
		t.Fatal(err)
	}
	if xmin("a") != a {
		t.Error("a's row was written though nothing of it moved")
	}
	if xmin("b") == b {
		t.Error("b's row was not written though its last_seen moved")
	}
}

// TestSendRefusalsRollBack: every refusal of relay_send comes back as the
// store's error and leaves nothing behind: no send record, no seq spent.
func TestSendRefusalsRollBack(t *testing.T) {
	db := openDB(t, 2)
	register(t, db, "home", "a", "b")
	ctx := testCtx(t)
	if _, err := db.Send(ctx, store.SendParams{Household: "home", Sender: "x", ID: "fill", To: []string{"a"}, Payload: make([]byte, 100), Now: t0}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []store.SendParams{
		{To: []string{"a", "ghost"}},
		{To: []string{"a", "b"}, MaxPendingEnvelopes: 1},
		{To: []string{"a", "b"}, MaxHouseholdPendingBytes: 101},
	} {
		p.Household, p.Sender, p.ID, p.Payload, p.Now = "home", "x", "refused", []byte("y"), t0
		if _, err := db.Send(ctx, p); err == nil {
			t.Fatalf("send %+v succeeded", p)
		}
	}
	var sends, heads int
	if err := db.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM sends), (SELECT sum(head) FROM devices)`).Scan(&sends, &heads); err != nil {
		t.Fatal(err)
	}
	if sends != 1 || heads != 1 {
		t.Errorf("after refusals: %d send records, heads add up to %d; want 1 and 1", sends, heads)
	}
	checkCounters(t, db)
}
