// Package postgres is the relay's store on PostgreSQL (jackc/pgx v5,
// pgxpool), for fleets of relays sharing one database. docs/FANOUT.md
// explains how a send locks and how a poll reads.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flamenet/relay/store"
)

var _ store.Store = (*DB)(nil)

// PingTimeout bounds Ping when its ctx allows longer: a readiness probe must
// not wait on a database that accepted the connection and went silent.
const PingTimeout = time.Second

// cancelGrace is how long a query whose ctx ended waits for the server to
// confirm the cancel request before the connection is cut. Sending the
// cancel request matters: a backend waiting on a row lock would otherwise
// keep waiting, and keep the locks it already holds, after we gave up.
const cancelGrace = 250 * time.Millisecond

// Session settings that keep one stuck party from spreading its stall:
//
//   - idle_in_transaction_session_timeout ends a session that sits in an
//     open transaction, so a relay that freezes mid-transaction cannot hold
//     rows for long (a send is one statement in autocommit, and holds
//     nothing between statements);
//   - lock_timeout (Config.LockTimeout) makes a statement that waits on a
//     row lock give up soon, so that whoever holds a device's row (a frozen
//     replica, a client of the database) costs sends to that device a quick
//     503, not every pooled connection for the whole store timeout;
//   - the TCP keepalives and client_connection_check_interval let the
//     server notice a relay host that hung or was cut off, and end its
//     sessions and their locks, instead of waiting for the kernel's hours.
const idleInTxTimeout = "5s"

// DefaultLockTimeout is Config.LockTimeout's default.
const DefaultLockTimeout = time.Second

// keepAlive is how the relay's side probes a silent connection.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3}

// Config says where the database is and how many connections to use.
type Config struct {
	// URL is a libpq-style URL or DSN. A search_path parameter in it is
	// passed to the server like any other runtime parameter.
	URL string
	// MaxConns caps the pool; zero keeps pgxpool's default.
	MaxConns int32
	// Schema, when set, is created if missing, becomes every connection's
	// search_path and holds the relay's tables.
	Schema string
	// LockTimeout bounds a statement's wait for a row lock; zero means
	// DefaultLockTimeout.
	LockTimeout time.Duration
	Logger      *slog.Logger
}

// DB is a store.Store on a Postgres connection pool.
type DB struct {
	pool *pgxpool.Pool
	// probe is the configuration Ping connects with, outside the pool.
	probe *pgx.ConnConfig
	// probeSem holds probeConn: one Ping at a time, on one connection
	// kept between Pings and opened again after a failure.
	probeSem  chan struct{}
	probeConn *pgx.Conn
	log       *slog.Logger
	// systemID: this role may read the server's system identifier
	// (History), until it is refused.
	systemID atomic.Bool
	// synchronous: the server commits synchronously, as History last
	// read; stalled: its standby did not confirm History's last write,
	// and reads are refused (timeline.go).
	synchronous, stalled atomic.Bool
}

// Open connects, applies pending migrations under an advisory lock, and
// returns a ready store.
func Open(ctx context.Context, cfg Config) (*DB, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	log = log.With("component", "store_postgres")

	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		// Not wrapped: pgconn's message quotes the URL with the password
		// masked only "best effort", and the error carries it unmasked.
		return nil, errors.New("postgres: the database URL does not parse")
	}
	if cfg.MaxConns > 0 {
		pc.MaxConns = cfg.MaxConns
	}
	params := pc.ConnConfig.RuntimeParams
	if cfg.Schema != "" {
		params["search_path"] = pgx.Identifier{cfg.Schema}.Sanitize()
	}
	lockTimeout := cfg.LockTimeout
	if lockTimeout <= 0 {
		lockTimeout = DefaultLockTimeout
	}
	for k, v := range map[string]string{
		"idle_in_transaction_session_timeout": idleInTxTimeout,
		"lock_timeout":                        strconv.FormatInt(lockTimeout.Milliseconds(), 10),
		"tcp_keepalives_idle":                 "10",
		"tcp_keepalives_interval":             "5",
		"tcp_keepalives_count":                "3",
		"client_connection_check_interval":    "5000",
	} {
		if _, ok := params[k]; !ok { // the URL's own settings win
			params[k] = v
		}
	}
	pc.ConnConfig.DialFunc = (&net.Dialer{KeepAliveConfig: keepAlive}).DialContext
	probe := pc.ConnConfig.Copy()
	pc.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: cancelGrace}
	}

	// Migrations wait for each other on an advisory lock, for as long as
	// the one ahead takes: no lock timeout there.
	mcc := pc.ConnConfig.Copy()
	mcc.RuntimeParams["lock_timeout"] = "0"
	mc, err := pgx.ConnectConfig(ctx, mcc)
	if err != nil {
		return nil, classify("connect", err)
	}
	err = migrateSchema(ctx, mc, params["search_path"], cfg.Schema, log)
	if cerr := mc.Close(ctx); err == nil && cerr != nil {
		err = classify("close migration connection", cerr)
	}
	if err != nil {
		return nil, err
	}

	// No query runs on a new connection before the timeline check: on a
	// promoted standby, the epoch changes first (timeline.go).
	pc.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		return checkTimeline(ctx, conn, log)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, classify("pool", err)
	}
	db := &DB{pool: pool, probe: probe, probeSem: make(chan struct{}, 1), log: log}
	db.systemID.Store(true)
	return db, nil
}

// Close closes the pool's connections and the probe's.
func (db *DB) Close() error {
	db.probeSem <- struct{}{}
	if db.probeConn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), PingTimeout)
		_ = db.probeConn.Close(ctx)
		cancel()
		db.probeConn = nil
	}
	<-db.probeSem
	db.pool.Close()
	return nil
}

// Ping checks the database on a connection of its own, so that a database
// that accepts connections and then hangs cannot take the pool's. The
// connection is kept for the next Ping (a probe must not cost the server a
// new session each time) and opened again after a failure. One Ping runs
// at a time; others wait for it within their own deadline.
func (db *DB) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	select {
	case db.probeSem <- struct{}{}:
	case <-ctx.Done():
		return classify("ping", ctx.Err())
	}
	defer func() { <-db.probeSem }()
	// A kept connection may have died since (a restart, an idle
	// timeout): one failure on it earns one try on a fresh connection.
	kept := db.probeConn != nil
	err := db.probeOnce(ctx)
	if err != nil && kept {
		err = db.probeOnce(ctx)
	}
	return err
}

// probeOnce runs one probe query, connecting first if needed; the caller
// holds probeSem.
func (db *DB) probeOnce(ctx context.Context) error {
	if db.probeConn == nil {
		cc := db.probe.Copy()
		cc.ConnectTimeout = PingTimeout
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			return classify("ping", err)
		}
		db.probeConn = conn
	}
	var writable, schema bool
	if err := db.probeConn.QueryRow(ctx, sqlProbe).Scan(&writable, &schema); err != nil {
		_ = db.probeConn.Close(context.WithoutCancel(ctx))
		db.probeConn = nil
		return classify("ping", err)
	}
	switch {
	case !writable:
		return fmt.Errorf("postgres: ping: the database is read-only (a standby, or read-only by setting): %w: %w", store.ErrUnavailable, store.ErrNotWritable)
	case !schema:
		return fmt.Errorf("postgres: ping: the relay's tables are missing (a database recreated empty?): %w", store.ErrUnavailable)
	}
	return nil
}

// sqlProbe asks whether the database can take the relay's writes: not a
// standby, not read-only, and its tables and functions in place. A
// database that answers but cannot do that is not ready.
const sqlProbe = `
SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off',
       to_regclass('envelopes') IS NOT NULL AND to_regproc('relay_send') IS NOT NULL`

// micro truncates t to what timestamptz keeps, in UTC, so a value read back
// equals the one written.
func micro(t time.Time) time.Time { return t.Truncate(time.Microsecond).UTC() }

// rollback ends tx after a failure, under the caller's ctx so that it
// cannot hang either. Its own error adds nothing: pgx closes a connection
// whose rollback failed, and the server rolls back when it goes.
func rollback(ctx context.Context, tx pgx.Tx) {
	_ = tx.Rollback(ctx)
}

var _ store.PoolStatser = (*DB)(nil)

// PoolStats reports the connection pool, for metrics.
func (db *DB) PoolStats() store.PoolStats {
	st := db.pool.Stat()
	return store.PoolStats{
		Max:          int(st.MaxConns()),
		Open:         int(st.TotalConns()),
		InUse:        int(st.AcquiredConns()),
		WaitCount:    st.EmptyAcquireCount(),
		WaitDuration: st.AcquireDuration(),
	}
}
