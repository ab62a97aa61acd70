package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
)

// Group commit: sends and ack batches go to one goroutine that runs as
// many of them as are waiting in one IMMEDIATE transaction, each inside a
// SAVEPOINT of its own, and commits once: one fsync for the whole group.
// A job that fails (a refused send) rolls back to its savepoint and keeps
// its error; the others commit. A group grows while it runs: each job
// finished, the writer takes the next one waiting, up to the bounds below,
// and commits when none waits. No timer: under light load a group is one
// job, and it commits at once.
const (
	// maxGroupJobs bounds the jobs in one transaction, so the commit that
	// answers the first of them is never far off.
	maxGroupJobs = 64
	// maxGroupBytes bounds the payload bytes one transaction writes (a
	// send counts its payload once per recipient). A job larger than this
	// runs in a group of its own.
	maxGroupBytes = 8 << 20
)

// errClosed answers a job submitted to a closed store.
var errClosed = errors.New("sqlite: store closed")

// querier is what a job runs its statements on: the writer connection,
// inside the group's transaction.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// job is one unit of a group. run writes through q and returns nil to keep
// its writes or an error to roll them back; whatever it reports beyond the
// error it keeps in its closure, for the caller to read once done answers
// nil.
type job struct {
	op    string
	bytes int64
	run   func(ctx context.Context, q querier) error
	done  chan error // capacity 1: the writer never waits on a caller
}

// submit hands j to the group writer and waits for the commit's word. A
// caller whose ctx ends before the writer took its job gets the ctx error
// and nothing of it is stored; once taken, the job's outcome is what the
// commit says, so the caller waits for it.
func (db *DB) submit(ctx context.Context, j *job) error {
	if err := ctx.Err(); err != nil {
		return wrap(ctx, j.op, err)
	}
	j.done = make(chan error, 1)
	db.waiting.Add(1)
	select {
	case db.jobs <- j:
		db.waiting.Add(-1)
	case <-ctx.Done():
		db.waiting.Add(-1)
		return wrap(ctx, j.op, ctx.Err())
	case <-db.quit:
		db.waiting.Add(-1)
		return fmt.Errorf("%s: %w", j.op, errClosed)
	}
	return <-j.done
}

// groupWriter runs groups until the store closes. The jobs channel is
// unbuffered, so a job is either taken or still its caller's.
func (db *DB) groupWriter() {
	defer close(db.stopped)
	var next *job
	for {
		if next == nil {
			select {
			case next = <-db.jobs:
			case <-db.quit:
				return
			}
		}
		next = db.runGroup(next)
	}
}

// runGroup runs first and whatever else is waiting in one transaction, and
// answers every job it ran. It returns a job it took but had no room for.
func (db *DB) runGroup(first *job) (carry *job) {
	// The jobs run on their own context: once taken, a job's caller going
	// away must not cut it off halfway through a group.
	ctx := context.Background()
	if err := db.beforeWrite(); err != nil {
		first.done <- err
		return nil
	}
	conn, err := db.writer.Conn(ctx)
	if err != nil {
		first.done <- wrap(ctx, first.op, err)
		return nil
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		// Busy past busy_timeout (another process), or a connection left
		// inside a transaction: a fresh connection is the clean start.
		discard(conn)
		first.done <- wrap(ctx, first.op, err)
		return nil
	}

	var (
		group []*job
		errs  []error
		bytes int64
	)
	fail := func(err error) {
		for _, j := range group {
			j.done <- wrap(ctx, j.op, err)
		}
	}
	for j := first; j != nil; {
		group = append(group, j)
		bytes += j.bytes
		jerr, err := db.runJob(ctx, conn, j)
		if err != nil {
			// The savepoint could not be rolled back: the transaction is in
			// no state to commit any of the group.
			rollback(ctx, conn)
			fail(err)
			return nil
		}
		errs = append(errs, jerr)

		j = nil
		if len(group) < maxGroupJobs && bytes < maxGroupBytes {
			select {
			case j = <-db.jobs:
				if bytes+j.bytes > maxGroupBytes {
					carry, j = j, nil
				}
			default:
			}
		}
	}

	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		// A failed COMMIT may leave the transaction open (a deferred
		// constraint, a busy database); end it so the connection is clean.
		rollback(ctx, conn)
		fail(err)
		return carry
	}
	db.groups.Add(1)
	for i, j := range group {
		j.done <- wrap(ctx, j.op, errs[i])
	}
	return carry
}

// rollback ends the group's transaction, and discards the connection if
// even that fails, so that the next group starts on a clean one.
func rollback(ctx context.Context, conn *sql.Conn) {
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		discard(conn)
	}
}

// discard makes database/sql close conn when it is released instead of
// handing it out again.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
}

// runJob runs j inside a savepoint: its error (jerr) rolls back only its
// own writes. err reports that the savepoint itself failed.
func (db *DB) runJob(ctx context.Context, conn *sql.Conn, j *job) (jerr, err error) {
	if _, err := conn.ExecContext(ctx, "SAVEPOINT job"); err != nil {
		return nil, err
	}
	jerr = j.run(ctx, conn)
	if jerr != nil {
		if _, err := conn.ExecContext(ctx, "ROLLBACK TO job"); err != nil {
			return nil, err
		}
	}
	if _, err := conn.ExecContext(ctx, "RELEASE job"); err != nil {
		return nil, err
	}
	return jerr, nil
}
