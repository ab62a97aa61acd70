package postgres

import (
	"context"
	"crypto/rand"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/flamenet/relay/internal/servicetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testCtx bounds a test's calls so that a hang fails the test instead of
// stalling the run.
func testCtx(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

// newSchema creates a throwaway schema on the test server and drops it, with
// everything in it, when the test ends.
func newSchema(tb testing.TB) (url, schema string) {
	tb.Helper()
	url = servicetest.PostgresURL(tb)
	schema = "test_" + strings.ToLower(rand.Text())
	admin(tb, url, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	tb.Cleanup(func() {
		admin(tb, url, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	return url, schema
}

// admin runs one statement on a connection of its own.
func admin(tb testing.TB, url, sql string, args ...any) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

// openDB opens a store on a fresh schema with a pool of maxConns, closed
// before the schema is dropped.
func openDB(tb testing.TB, maxConns int32) *DB {
	tb.Helper()
	url, schema := newSchema(tb)
	db, err := Open(testCtx(tb), Config{URL: url, Schema: schema, MaxConns: maxConns, Logger: testLogger(tb)})
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// schemaConn is a plain connection whose search_path is db's schema, for
// tests that look at rows directly or hold locks of their own.
func schemaConn(tb testing.TB, db *DB) *pgx.Conn {
	tb.Helper()
	ctx := testCtx(tb)
	conn, err := pgx.ConnectConfig(ctx, db.probe.Copy())
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func testLogger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// tbWriter sends log lines to the test's log.
type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
