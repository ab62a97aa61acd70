package stack

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flamenet/relay/internal/procstat"
	"github.com/flamenet/relay/internal/servicetest"
)

// needServices skips without what a campaign starts, or fails under
// FN_TEST_REQUIRE_SERVICES=1.
func needServices(t *testing.T) {
	t.Helper()
	if err := ServicesMissing(); err != nil {
		servicetest.Unavailable(t, "initdb, postgres and redis-server (a fault campaign's own servers)", err)
	}
}

// TestCampaignServices starts the campaign's own Postgres and Redis,
// pauses Postgres (a query on a connection opened before stalls until it
// is continued: the pause reaches the backends, which Postgres puts in
// sessions of their own), kills and restarts it (the backends die with
// it), pauses Redis, and tears both down with their directories. Paused
// through its process group, as at first, the open connection's query
// went on answering.
func TestCampaignServices(t *testing.T) {
	needServices(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sv, err := StartServices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sv.Close()
	if strings.Contains(sv.PGURL, ":5432/") || strings.Contains(sv.RedisURL, ":6379/") {
		t.Fatalf("campaign services on the machine's ports: %s %s", sv.PGURL, sv.RedisURL)
	}
	query := func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS t (n int); INSERT INTO t VALUES (1)")
		return err
	}
	conn, err := pgx.Connect(ctx, sv.PGURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := query(ctx, conn); err != nil {
		t.Fatal(err)
	}

	if err := sv.PG.Pause(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- query(ctx, conn) }()
	select {
	case err := <-done:
		t.Errorf("a query on an open connection answered while Postgres was paused (%v)", err)
		done <- nil
	case <-time.After(300 * time.Millisecond):
	}
	if err := sv.PG.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("the query after the pause: %v", err)
	}

	leader, _ := sv.PG.leader()
	procs := append(procstat.Children(leader), leader)
	if len(procs) < 3 {
		t.Fatalf("Postgres has processes %v, want its leader, its helpers and a backend", procs)
	}
	if err := sv.PG.Kill(); err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(procs, procstat.Alive) {
		t.Errorf("Postgres processes alive after the kill: %v of %v", slices.DeleteFunc(slices.Clone(procs), func(p int) bool { return !procstat.Alive(p) }), procs)
	}
	if err := sv.PG.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := query(ctx, conn); err == nil {
		t.Errorf("a connection to the killed Postgres still answers")
	}
	conn2, err := pgx.Connect(ctx, sv.PGURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close(context.Background())
	if err := query(ctx, conn2); err != nil {
		t.Errorf("after the restart: %v", err)
	}

	if err := sv.Redis.Pause(); err != nil {
		t.Fatal(err)
	}
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	err = sv.Redis.ready(short)
	stop()
	if err == nil {
		t.Errorf("a paused Redis answered PING")
	}
	if err := sv.Redis.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := sv.Redis.ready(ctx); err != nil {
		t.Errorf("resumed Redis: %v", err)
	}

	pgLeader, _ := sv.PG.leader()
	redisLeader, _ := sv.Redis.leader()
	left := append(procstat.Children(pgLeader), pgLeader, redisLeader)
	dirs := []string{sv.PG.dir, sv.Redis.dir}
	if err := sv.Close(); err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(left, procstat.Alive) {
		t.Errorf("processes alive after close: %v", slices.DeleteFunc(slices.Clone(left), func(p int) bool { return !procstat.Alive(p) }))
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", d, err)
		}
	}
}
