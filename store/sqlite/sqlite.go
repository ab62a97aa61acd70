// Package sqlite is the store backend for one household on one machine, on
// modernc.org/sqlite (no cgo).
//
// It must never answer "database is locked". Every write goes through one
// writer connection whose transactions begin IMMEDIATE, so two writers of
// this process never meet inside SQLite and a transaction never has to
// upgrade a read lock into a write lock (the upgrade is what fails with
// SQLITE_BUSY at once, whatever busy_timeout says). Reads run on a separate
// pool of read-only connections; in WAL mode they never wait for the
// writer. busy_timeout covers the rest: another process on the same file,
// such as a migration run beside the server.
//
// Sends and batches of acks are committed in groups (group.go): one
// goroutine takes them from their callers and runs as many as are waiting
// in one IMMEDIATE transaction on that same writer connection, each inside
// a SAVEPOINT of its own so that a refused send rolls back alone, and
// commits once. With synchronous=FULL a commit is an fsync, so a group of n
// sends costs one fsync instead of n. The other writes are transactions of
// their own on the writer connection, between groups.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/flamenet/relay/store"
)

var _ store.Store = (*DB)(nil)

// Config says where the database lives and how it is opened.
type Config struct {
	// Path of the database file; its directory is created if missing.
	Path string
	// Synchronous is PRAGMA synchronous: OFF, NORMAL, FULL (default) or
	// EXTRA. FULL makes every commit durable before Send answers.
	Synchronous string
	// Readers is the size of the read pool; 0 means max(4, GOMAXPROCS).
	Readers int
	// BusyTimeout bounds a wait for another process's lock; 0 means 5s.
	BusyTimeout time.Duration
	// Logger receives migration notices; nil discards them.
	Logger *slog.Logger
	// Serve: the store is a serving relay's, which must be the only one
	// on the file: it remembers positions it wrote and never sees another
	// relay's writes. Another store opened to serve is refused while this
	// one is open; Backup, and stores opened without Serve (a migration),
	// still open the file beside it.
	Serve bool
}

// DB is a SQLite store. Its methods are safe for concurrent use.
type DB struct {
	writer *sql.DB // exactly one connection: every write goes here
	reader *sql.DB // read-only, query_only connections
	ping   *sql.DB // one connection of its own so a busy read pool cannot fail a probe
	log    *slog.Logger

	// path and opened: the database file, as opened (writable.go).
	path   string
	opened os.FileInfo
	// held is the shared lock on the file (lock_unix.go) that keeps
	// Restore from replacing it while open.
	held atomic.Pointer[os.File]
	// served is claim's lock (lock_unix.go), when opened with Serve.
	served *os.File
	// unwritable: a check found the database unwritable; the writer's
	// connection may be read-only since (refreshWriter).
	unwritable atomic.Bool

	// The group writer (group.go): sends and ack batches, committed
	// together.
	jobs      chan *job     // unbuffered: a job is taken or still its caller's
	quit      chan struct{} // closed by Close
	stopped   chan struct{} // closed when the group writer has returned
	closeOnce sync.Once
	waiting   atomic.Int64 // callers waiting for the writer to take their job
	groups    atomic.Int64 // groups committed
}

// Open opens (creating if needed) the database at cfg.Path and applies any
// pending migrations.
func Open(ctx context.Context, cfg Config) (*DB, error) {
	if cfg.Path == "" {
		return nil, errors.New("sqlite: empty path")
	}
	sync := strings.ToUpper(cfg.Synchronous)
	if sync == "" {
		sync = "FULL"
	}
	switch sync {
	case "OFF", "NORMAL", "FULL", "EXTRA":
	default:
		return nil, fmt.Errorf("sqlite: synchronous %q: want OFF, NORMAL, FULL or EXTRA", cfg.Synchronous)
	}
	readers := cfg.Readers
	if readers <= 0 {
		readers = max(4, runtime.GOMAXPROCS(0))
	}
	busy := cfg.BusyTimeout
	if busy <= 0 {
		busy = 5 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	path, err := filepath.Abs(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("sqlite: %w: %w", store.ErrUnavailable, err)
	}
	var served *os.File // claim's lock: the DB holds it once opened
	if cfg.Serve {
		if served, err = claim(path); errors.Is(err, errServed) {
			return nil, fmt.Errorf("sqlite: %s is %w", cfg.Path, err)
		} else if err != nil {
			return nil, fmt.Errorf("sqlite: %s: %w", path, err)
		}
		defer func() {
			if served != nil {
				_ = release(served) // Open failed
			}
		}()
	}
	held, err := lock(path, false)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %s: %w: %w", path, store.ErrUnavailable, err)
	}

	common := url.Values{}
	common.Set("_busy_timeout", strconv.FormatInt(busy.Milliseconds(), 10))
	common.Set("_dqs", "0")

	w := url.Values{}
	for k, v := range common {
		w[k] = v
	}
	w.Set("_txlock", "immediate")
	w.Set("_journal_mode", "WAL")
	w.Set("_synchronous", sync)
	w.Set("_foreign_keys", "1")
	writer, err := openDB(dsn(path, w))
	if err != nil {
		held.Close()
		return nil, fmt.Errorf("sqlite: open writer: %w", err)
	}
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	writer.SetConnMaxLifetime(0)
	writer.SetConnMaxIdleTime(0)

	db := &DB{writer: writer, log: log.With("component", "store_sqlite"), path: path}
	db.held.Store(held)
	// The writer goes first: it creates the file, switches it to WAL and
	// migrates, all of which the read-only connections could not do.
	if err := connect(ctx, writer, busy); err != nil {
		writer.Close()
		return nil, wrap(ctx, "open writer", err)
	}
	if err := db.migrate(ctx); err != nil {
		writer.Close()
		return nil, err
	}
	if err := db.ensureEpoch(ctx); err != nil {
		writer.Close()
		return nil, err
	}

	r := url.Values{}
	for k, v := range common {
		r[k] = v
	}
	r.Set("mode", "ro")
	r.Set("_query_only", "1")
	reader, err := openDB(dsn(path, r))
	if err != nil {
		writer.Close()
		return nil, fmt.Errorf("sqlite: open readers: %w", err)
	}
	reader.SetMaxOpenConns(readers)
	reader.SetMaxIdleConns(readers)
	db.reader = reader

	ping, err := openDB(dsn(path, r))
	if err != nil {
		reader.Close()
		writer.Close()
		return nil, fmt.Errorf("sqlite: open probe: %w", err)
	}
	ping.SetMaxOpenConns(1)
	ping.SetMaxIdleConns(1)
	db.ping = ping

	if err := db.probe(ctx); err != nil {
		db.Close()
		return nil, err
	}
	if db.opened, err = os.Stat(path); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	// A database that cannot be written is served anyway, not ready (Ping
	// says why): a chown or chmod then brings it back without a restart.
	if err := db.writable(); err != nil {
		db.unwritable.Store(true)
		log.Error("the database cannot be written: every write fails until it can", "err", err)
	}
	db.jobs, db.quit, db.stopped = make(chan *job), make(chan struct{}), make(chan struct{})
	go db.groupWriter()
	db.served, served = served, nil
	return db, nil
}

// connect makes the pool's first connection, trying again for up to busy
// while SQLite answers SQLITE_BUSY. Switching a new file to WAL needs the
// file to itself, and when two processes open a new file at once SQLite
// answers one of them SQLITE_BUSY at once instead of calling the busy
// handler, because waiting there could deadlock.
func connect(ctx context.Context, pool *sql.DB, busy time.Duration) error {
	deadline := time.Now().Add(busy)
	pause := 5 * time.Millisecond
	for {
		c, err := pool.Conn(ctx)
		if err == nil {
			return c.Close()
		}
		var se *sqlite.Error
		if !errors.As(err, &se) || se.Code()&0xff != sqlite3.SQLITE_BUSY || time.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// dsn builds a file: URI, so that SQLite itself sees mode=ro and a path
// holding '?' or '#' survives. path must be absolute: SQLite reads a
// relative one's first segment as the URI's authority ("invalid uri
// authority: data").
func dsn(path string, q url.Values) string {
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(path), RawQuery: q.Encode()}
	return u.String()
}

// Ping runs a query on the probe's own connection.
func (db *DB) Ping(ctx context.Context) error {
	if err := db.probe(ctx); err != nil {
		return err
	}
	if err := db.writable(); err != nil {
		db.unwritable.Store(true)
		return fmt.Errorf("sqlite: ping: %w: %w: %w", store.ErrUnavailable, store.ErrNotWritable, err)
	}
	return nil
}

// probe reads through the probe's own connection.
func (db *DB) probe(ctx context.Context) error {
	var n int
	if err := db.ping.QueryRowContext(ctx, `SELECT count(*) FROM schema_version`).Scan(&n); err != nil {
		return wrap(ctx, "ping", err)
	}
	return nil
}

// SingleWriter reports that every write of this store goes through one
// writer: nothing holds a device's row but that writer, and sends queue in
// its group commit, so a relay need not queue them per device itself.
func (db *DB) SingleWriter() bool { return true }

// Close closes the readers first and the writer last, so that the last
// connection to close is the one allowed to checkpoint and remove the WAL.
func (db *DB) Close() error {
	if db.stopped != nil {
		// Let the group in progress commit; callers still waiting to be
		// taken get errClosed.
		db.closeOnce.Do(func() { close(db.quit) })
		<-db.stopped
	}
	var errs []error
	if db.ping != nil {
		errs = append(errs, db.ping.Close())
	}
	if db.reader != nil {
		errs = append(errs, db.reader.Close())
	}
	errs = append(errs, db.writer.Close())
	if held := db.held.Swap(nil); held != nil {
		errs = append(errs, held.Close()) // last: the database is closed
	}
	if db.served != nil {
		errs = append(errs, release(db.served))
		db.served = nil
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sqlite: close: %w", err)
	}
	return nil
}

// wrap turns a driver error into the store's vocabulary. A deadline that ran
// out is ErrUnavailable (and still the context's error); a cancelled context
// is returned as itself, since the caller has gone; errors that say the file
// or the disk failed are ErrUnavailable. Store sentinels pass through.
func wrap(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if isStoreError(err) {
		return err
	}
	if ce := ctx.Err(); ce != nil && !errors.Is(err, ce) {
		err = fmt.Errorf("%w (%w)", ce, err)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("sqlite: %s: %w: %w", op, store.ErrUnavailable, err)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("sqlite: %s: %w", op, err)
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR,
			sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_FULL, sqlite3.SQLITE_NOMEM,
			sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PROTOCOL, sqlite3.SQLITE_PERM:
			return fmt.Errorf("sqlite: %s: %w: %w", op, store.ErrUnavailable, err)
		}
	}
	return fmt.Errorf("sqlite: %s: %w", op, err)
}

func isStoreError(err error) bool {
	for _, s := range []error{store.ErrNotFound, store.ErrUnknownDevice, store.ErrConflict,
		store.ErrQueueFull, store.ErrHouseholdFull, store.ErrCursorAhead, store.ErrUnavailable, store.ErrRemoved, store.ErrRefused, errClosed} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// write runs fn in one IMMEDIATE transaction on the writer connection and
// commits if fn returns nil. fn's store errors come back unwrapped.
func (db *DB) write(ctx context.Context, op string, fn func(tx *sql.Tx) error) error {
	if err := db.beforeWrite(); err != nil {
		return err
	}
	tx, err := db.writer.BeginTx(ctx, nil)
	if err != nil {
		return wrap(ctx, op, err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return wrap(ctx, op, err)
	}
	if err := tx.Commit(); err != nil {
		return wrap(ctx, op, err)
	}
	return nil
}

// read runs fn in one read transaction on a reader, so that all its queries
// see the same snapshot.
func (db *DB) read(ctx context.Context, op string, fn func(tx *sql.Tx) error) error {
	tx, err := db.reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return wrap(ctx, op, err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only: nothing to lose
	if err := fn(tx); err != nil {
		return wrap(ctx, op, err)
	}
	return nil
}

// micros stores times as Unix microseconds, which round-trip exactly.
func micros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

var _ store.PoolStatser = (*DB)(nil)

// PoolStats reports the writer and reader pools together, for metrics.
func (db *DB) PoolStats() store.PoolStats {
	w, r := db.writer.Stats(), db.reader.Stats()
	return store.PoolStats{
		Max:          w.MaxOpenConnections + r.MaxOpenConnections,
		Open:         w.OpenConnections + r.OpenConnections,
		InUse:        w.InUse + r.InUse,
		WaitCount:    w.WaitCount + r.WaitCount,
		WaitDuration: w.WaitDuration + r.WaitDuration,
	}
}
