package postgres

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/store"
)

// TestNextEpochRow is the rule, case by case: a new timeline keeps the
// epoch only when the primary it replaced committed synchronously.
func TestNextEpochRow(t *testing.T) {
	fresh := func() string { return "new" }
	row := func(epoch, tl string, sync bool) *epochRow {
		return &epochRow{Epoch: epoch, Timeline: tl, Synchronous: sync}
	}
	for _, c := range []struct {
		name     string
		row      *epochRow
		timeline string
		sync     bool
		want     epochRow
		write    bool
	}{
		{"no row yet", nil, "00000001", false, epochRow{"new", "00000001", false}, true},
		{"no row yet, synchronous", nil, "00000001", true, epochRow{"new", "00000001", true}, true},
		{"nothing changed", row("e", "00000001", false), "00000001", false, epochRow{"e", "00000001", false}, false},
		{"nothing changed, synchronous", row("e", "00000001", true), "00000001", true, epochRow{"e", "00000001", true}, false},
		{"promoted after asynchronous commits", row("e", "00000001", false), "00000002", false, epochRow{"new", "00000002", false}, true},
		{"promoted after asynchronous commits, synchronous now", row("e", "00000001", false), "00000002", true, epochRow{"new", "00000002", true}, true},
		{"promoted after synchronous commits", row("e", "00000001", true), "00000002", false, epochRow{"e", "00000002", false}, true},
		{"promoted after synchronous commits, synchronous now", row("e", "00000001", true), "00000002", true, epochRow{"e", "00000002", true}, true},
		{"synchronous commit turned on", row("e", "00000001", false), "00000001", true, epochRow{"e", "00000001", true}, true},
		{"synchronous commit turned off", row("e", "00000001", true), "00000001", false, epochRow{"e", "00000001", false}, true},
	} {
		got, write := nextEpochRow(c.row, c.timeline, c.sync, fresh)
		if got != c.want || write != c.write {
			t.Errorf("%s: nextEpochRow = %+v, %v, want %+v, %v", c.name, got, write, c.want, c.write)
		}
	}
}

// TestTimelineCheckOnNewConnections: the row as a promotion leaves it
// (another timeline recorded than the server's), and what a new
// connection's check makes of it. The server's timeline does not change
// here; the row's does, which the check cannot tell apart.
func TestTimelineCheckOnNewConnections(t *testing.T) {
	ctx := testCtx(t)
	db := openDB(t, 2)
	first, err := db.History(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := schemaConn(t, db)
	var tl string
	var sync bool
	if err := conn.QueryRow(ctx, `SELECT timeline, synchronous FROM store_epoch`).Scan(&tl, &sync); err != nil {
		t.Fatal(err)
	}
	if len(tl) != 8 || sync {
		t.Fatalf("recorded timeline %q, synchronous %v: want 8 hex digits, and this test server commits asynchronously", tl, sync)
	}
	// After a failover every connection is new: Reset makes it so (History
	// checks on a pooled connection too).
	recheck := func() store.History {
		t.Helper()
		db.pool.Reset()
		h, err := db.History(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}

	if _, err := conn.Exec(ctx, `UPDATE store_epoch SET timeline = 'FFFFFFFF', synchronous = true`); err != nil {
		t.Fatal(err)
	}
	h := recheck()
	if h.Epoch != first.Epoch {
		t.Errorf("after a promotion from a synchronous primary, epoch %q, want %q kept", h.Epoch, first.Epoch)
	}
	if err := conn.QueryRow(ctx, `SELECT timeline, synchronous FROM store_epoch`).Scan(&tl, &sync); err != nil {
		t.Fatal(err)
	}
	if tl == "FFFFFFFF" || sync {
		t.Errorf("the row after the check: timeline %q, synchronous %v; want the server's timeline, asynchronous", tl, sync)
	}

	if _, err := conn.Exec(ctx, `UPDATE store_epoch SET timeline = 'FFFFFFFF', synchronous = false`); err != nil {
		t.Fatal(err)
	}
	h = recheck()
	if h.Epoch == first.Epoch || len(h.Epoch) != 16 {
		t.Errorf("after a promotion from an asynchronous primary, epoch %q, want a new one", h.Epoch)
	}
	if again := recheck(); again.Epoch != h.Epoch {
		t.Errorf("a second check changed the epoch again: %q, then %q", h.Epoch, again.Epoch)
	}
	// A store's reads name the new epoch at once.
	st, err := db.State(ctx, "home", "a")
	if err != nil || st.Epoch != h.Epoch {
		t.Errorf("State after the change = %+v, %v, want epoch %q", st, err, h.Epoch)
	}
}

// TestFirstEpochLoggedOnce: two connections of a new database find no
// epoch at once and both draw one; the first insert wins, and only the
// epoch kept is logged as recorded. Here the test's own transaction is
// the first, held open until the check's insert waits on it. Red when
// the loser logged the epoch it drew, which no one ever saw again.
func TestFirstEpochLoggedOnce(t *testing.T) {
	ctx := testCtx(t)
	db := openDB(t, 1)
	first := schemaConn(t, db)
	if _, err := first.Exec(ctx, `DELETE FROM store_epoch`); err != nil {
		t.Fatal(err)
	}
	tx, err := first.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, sqlInsertEpoch, "kept", "00000001", false); err != nil {
		t.Fatal(err)
	}

	second := schemaConn(t, db)
	log := &servicetest.Buffer{}
	checked := make(chan error, 1)
	go func() {
		checked <- checkTimeline(ctx, second, slog.New(slog.NewJSONHandler(log, nil)))
	}()
	// The check's insert waits for the first's transaction.
	watch := schemaConn(t, db)
	for waiting := false; !waiting; {
		err := watch.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, second.PgConn().PID()).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-checked; err != nil {
		t.Fatal(err)
	}

	var kept string
	if err := watch.QueryRow(ctx, `SELECT epoch FROM store_epoch`).Scan(&kept); err != nil || kept != "kept" {
		t.Fatalf("epoch %q (%v), want the first insert's", kept, err)
	}
	for line := range strings.Lines(log.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if m["msg"] == "store epoch recorded" && m["epoch"] != kept {
			t.Errorf("logged %q as recorded; the store's epoch is %q", m["epoch"], kept)
		}
	}
}
