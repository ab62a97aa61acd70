package postgres

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
)

// countingHandler counts "applied migration" records across loggers.
type countingHandler struct {
	slog.Handler
	applied *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "applied migration" {
		h.applied.Add(1)
	}
	return nil
}

func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) Enabled(context.Context, slog.Level) bool {
	return true
}

// TestConcurrentOpen starts several replicas on one fresh schema at once:
// every Open succeeds and each migration is applied exactly once.
//
// The guard is the advisory lock around migrate: without it, this test
// failed with duplicate-key errors from concurrent CREATE TABLEs (checked
// once by hand).
func TestConcurrentOpen(t *testing.T) {
	const replicas = 6
	url, schema := newSchema(t)
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	var applied atomic.Int64
	log := slog.New(countingHandler{Handler: slog.DiscardHandler, applied: &applied})

	ctx := testCtx(t)
	start := make(chan struct{})
	dbs := make([]*DB, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			dbs[i], errs[i] = Open(ctx, Config{URL: url, Schema: schema, MaxConns: 1, Logger: log})
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: Open: %v", i, err)
			continue
		}
		dbs[i].Close()
	}
	if got, want := applied.Load(), int64(len(ms)); got != want {
		t.Errorf("%d migrations applied, want %d (each once)", got, want)
	}

	db, err := Open(ctx, Config{URL: url, Schema: schema, MaxConns: 1, Logger: log})
	if err != nil {
		t.Fatalf("Open again: %v", err)
	}
	defer db.Close()
	var versions, latest int
	if err := db.pool.QueryRow(ctx, "SELECT count(*), max(version) FROM schema_version").Scan(&versions, &latest); err != nil {
		t.Fatal(err)
	}
	if versions != len(ms) || latest != ms[len(ms)-1].Version {
		t.Errorf("schema_version holds %d versions up to %d, want %d up to %d", versions, latest, len(ms), ms[len(ms)-1].Version)
	}
	if got := applied.Load(); got != int64(len(ms)) {
		t.Errorf("reopening applied %d more migrations, want none", got-int64(len(ms)))
	}
}

// TestOpenCreatesSchema opens a schema that does not exist yet.
func TestOpenCreatesSchema(t *testing.T) {
	url, schema := newSchema(t)
	admin(t, url, "DROP SCHEMA "+schema) // newSchema's cleanup drops it again
	db, err := Open(testCtx(t), Config{URL: url, Schema: schema, MaxConns: 1})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer db.Close()
	register(t, db, "home", "a")
}
