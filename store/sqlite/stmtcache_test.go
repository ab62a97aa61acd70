package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/flamenet/relay/store"
)

// writerPrepared is how many statements the writer's connection has
// prepared for its cache.
func writerPrepared(t *testing.T, db *DB) int {
	t.Helper()
	conn, err := db.writer.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return connPrepared(t, conn)
}

// writerConn holds the writer connection of a new store until the test
// ends.
func writerConn(t *testing.T) *sql.Conn {
	t.Helper()
	db := openTB(t, tempPath(t))
	t.Cleanup(func() { db.Close() })
	conn, err := db.writer.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// connPrepared is how many statements conn has prepared for its cache.
func connPrepared(t *testing.T, conn *sql.Conn) int {
	t.Helper()
	n := -1
	if err := conn.Raw(func(dc any) error {
		n = dc.(*cachingConn).prepared
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestStatementsPreparedOnce: sends after the first prepare nothing more
// on the writer; each reruns the statements the first one prepared.
func TestStatementsPreparedOnce(t *testing.T) {
	db := openTB(t, tempPath(t))
	defer db.Close()
	ctx := context.Background()
	if _, err := db.Register(ctx, store.RegisterParams{Household: "h", Device: "d", Now: t0}); err != nil {
		t.Fatal(err)
	}
	send := func(i int) {
		if _, err := db.Send(ctx, store.SendParams{Household: "h", Sender: "s", ID: fmt.Sprint("m", i), To: []string{"d"}, Payload: []byte("x"), Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
	send(0)
	after1 := writerPrepared(t, db)
	if after1 == 0 {
		t.Fatal("the first send prepared nothing for the cache")
	}
	for i := 1; i < 20; i++ {
		send(i)
	}
	if n := writerPrepared(t, db); n != after1 {
		t.Errorf("20 sends prepared %d statements, 1 send %d: the later ones prepared again", n, after1)
	}
}

// TestStatementRerunWhileItsRowsAreOpen: a query run again on the same
// connection while its first rows are still being read gets a statement
// of its own; both read every row.
func TestStatementRerunWhileItsRowsAreOpen(t *testing.T) {
	ctx := context.Background()
	conn := writerConn(t)
	const q = `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3) SELECT i FROM n`
	read := func(rows *sql.Rows) []int {
		var got []int
		for rows.Next() {
			var i int
			if err := rows.Scan(&i); err != nil {
				t.Fatal(err)
			}
			got = append(got, i)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return got
	}
	outer, err := conn.QueryContext(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Close()
	if !outer.Next() {
		t.Fatal("no first row")
	}
	inner, err := conn.QueryContext(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(inner); fmt.Sprint(got) != "[1 2 3]" {
		t.Errorf("inner rows %v, want [1 2 3]", got)
	}
	inner.Close()
	if got := read(outer); fmt.Sprint(got) != "[2 3]" {
		t.Errorf("outer rows after the first %v, want [2 3]", got)
	}
	outer.Close()
	// Free again: the next run reads from the start.
	again, err := conn.QueryContext(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if got := read(again); fmt.Sprint(got) != "[1 2 3]" {
		t.Errorf("rows of the next run %v, want [1 2 3]", got)
	}
}

// TestStatementCacheMakesRoom: once statements built at run time have
// filled a connection's cache, a statement run twice is still prepared
// once and then run from the cache.
func TestStatementCacheMakesRoom(t *testing.T) {
	ctx := context.Background()
	conn := writerConn(t)
	for i := range maxCachedStmts + 10 {
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("SELECT %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	before := connPrepared(t, conn)
	for range 2 {
		if _, err := conn.ExecContext(ctx, "SELECT 'constant'"); err != nil {
			t.Fatal(err)
		}
	}
	if n := connPrepared(t, conn) - before; n != 1 {
		t.Errorf("a statement run twice on a full cache was prepared for it %d times, want 1", n)
	}
}

// TestStatementCacheKeepsBusyStatements: a full cache whose every
// statement has rows open makes no room; the next statement runs without
// the cache, and every open rows reads on.
func TestStatementCacheKeepsBusyStatements(t *testing.T) {
	ctx := context.Background()
	conn := writerConn(t)
	open := make([]*sql.Rows, maxCachedStmts)
	for i := range open {
		rows, err := conn.QueryContext(ctx, fmt.Sprintf("SELECT %d UNION ALL SELECT %d", i, -i))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		if !rows.Next() {
			t.Fatalf("rows %d: no first row: %v", i, rows.Err())
		}
		open[i] = rows
	}
	var n int
	if err := conn.QueryRowContext(ctx, "SELECT 7").Scan(&n); err != nil || n != 7 {
		t.Fatalf("a statement beside a full, busy cache: %d, %v", n, err)
	}
	for i, rows := range open {
		var first, second int
		if err := rows.Scan(&first); err != nil {
			t.Fatalf("rows %d: %v", i, err)
		}
		if !rows.Next() {
			t.Fatalf("rows %d: no second row: %v", i, rows.Err())
		}
		if err := rows.Scan(&second); err != nil || first != i || second != -i {
			t.Fatalf("rows %d read %d, %d (%v), want %d, %d", i, first, second, err, i, -i)
		}
	}
}
