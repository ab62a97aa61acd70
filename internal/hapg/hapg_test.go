package hapg_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/hapg"
	"github.com/flamenet/relay/internal/hapg/hapgtest"
	"github.com/jackc/pgx/v5"
)

// insert commits n rows, one transaction each, on the formation's URL.
func insert(t *testing.T, ctx context.Context, url string, from, n int) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS t (i int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	for i := from; i < from+n; i++ {
		if _, err := conn.Exec(ctx, "INSERT INTO t VALUES ($1)", i); err != nil {
			t.Fatal(err)
		}
	}
}

func count(t *testing.T, ctx context.Context, url string) int {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// gone fails the test when a process of dir is still alive.
func gone(t *testing.T, dir string) {
	t.Helper()
	if left := hapg.Members(nil, dir); len(left) > 0 {
		t.Errorf("processes %v of %s still alive", left, dir)
	}
}

// TestStandbyLostSync: with synchronous replication and the standby lost,
// a commit waits only until the monitor takes synchronous replication off
// the primary (wait_primary), which it does on its own.
func TestStandbyLostSync(t *testing.T) {
	f := hapgtest.Start(t, hapg.Sync)
	ctx := t.Context()
	insert(t, ctx, f.URL(), 0, 1)
	primary, err := f.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	standby := f.Standby(primary)
	killedAt := time.Now()
	if err := f.Kill(standby); err != nil {
		t.Fatal(err)
	}
	// This commit waits for a standby that is gone, until the monitor
	// drops it from synchronous_standby_names.
	insert(t, ctx, f.URL(), 1, 1)
	took := time.Since(killedAt)
	t.Logf("a commit after the standby's kill took %v", took.Round(time.Millisecond))
	if took > 15*time.Second {
		t.Errorf("commit took %v after the standby's loss, want under 15s", took)
	}
	names, err := f.SyncStandbyNames(ctx, primary)
	if err != nil || names != "" {
		t.Errorf("primary's synchronous_standby_names %q (%v) with the standby lost, want empty", names, err)
	}
	if got := count(t, ctx, f.URL()); got != 2 {
		t.Errorf("%d rows, want 2", got)
	}
	gone(t, standby.Dir())

	// Close leaves no process and no directory behind.
	dir := f.Dir
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	gone(t, dir)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still there after Close (%v)", dir, err)
	}
}

// TestAsyncCutLosesCommits: with asynchronous replication and the WAL
// sender stopped, commits the primary answered are lost when it dies,
// and the manager still promotes the standby. Then a stale formation (its
// owner gone) is cleaned up by the next start's CleanStale.
func TestAsyncCutLosesCommits(t *testing.T) {
	f := hapgtest.Start(t, hapg.Async)
	ctx := t.Context()
	names, err := f.SyncStandbyNames(ctx, f.Nodes[0])
	if err != nil || names != "" {
		t.Fatalf("async primary's synchronous_standby_names %q (%v), want empty", names, err)
	}
	insert(t, ctx, f.URL(), 0, 10)
	// Let the standby have the first ten: replay reached the primary's LSN.
	waitReplayed(t, ctx, f)
	if _, err := f.CutReplication(ctx); err != nil {
		t.Fatal(err)
	}
	insert(t, ctx, f.URL(), 10, 5)
	old, err := f.KillPrimary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WaitPrimary(ctx, old); err != nil {
		t.Fatal(err)
	}
	if got := count(t, ctx, f.URL()); got != 10 {
		t.Errorf("%d rows on the promoted node, want 10: the 5 committed while cut off lost", got)
	}

	// The owner of this formation "dies": a process that has exited.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	owner := strconv.Itoa(dead.Process.Pid) + " 1\n"
	if err := os.WriteFile(f.Dir+"/owner", []byte(owner), 0o644); err != nil {
		t.Fatal(err)
	}
	hapg.CleanStale()
	gone(t, f.Dir)
	if _, err := os.Stat(f.Dir); !os.IsNotExist(err) {
		t.Errorf("stale %s still there (%v)", f.Dir, err)
	}
}

// waitReplayed waits until the standby has replayed what the primary has.
func waitReplayed(t *testing.T, ctx context.Context, f *hapg.Formation) {
	t.Helper()
	p, err := f.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = hapg.Poll(ctx, 30*time.Second, "the standby to replay", func() error {
		var caughtUp bool
		err := f.Query(ctx, p, hapg.Database, func(c *pgx.Conn) error {
			return c.QueryRow(ctx, "SELECT count(*) = 1 AND bool_and(replay_lsn = pg_current_wal_lsn()) FROM pg_stat_replication").Scan(&caughtUp)
		})
		if err == nil && !caughtUp {
			err = context.DeadlineExceeded
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
