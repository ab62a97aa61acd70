package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flamenet/relay/store"
)

// The epoch on Postgres. A failover promotes a standby, which starts a new
// timeline; a standby that replicated asynchronously may lack the last
// commits, so the store's history may have gone back, and the epoch must
// change. A standby that replicated synchronously holds every commit (a
// manager such as pg_auto_failover promotes only such a one), and the
// epoch stays. Every new connection checks, before it runs anything else
// (pgxpool's AfterConnect), the server's timeline against the one
// store_epoch records, and records whether the server commits
// synchronously, for the next failover to read.
//
// The rule's limit: synchronous replication turned off just before a
// failover (by a person, or by the manager because the standby was down)
// is seen only by the next new connection or History check. If the
// primary then fails before either, the row still says synchronous, and
// the epoch stays although the promoted standby may lack commits.

// epochRow is store_epoch's row.
type epochRow struct {
	Epoch       string
	Timeline    string
	Synchronous bool
}

// nextEpochRow is the check's decision: the row as it must be, given the
// row as it is (nil: none yet) and the server's timeline and synchronous
// commit, and whether it must be written. A new epoch is drawn only when
// the timeline changed under a primary that did not commit synchronously.
func nextEpochRow(row *epochRow, timeline string, synchronous bool, newEpoch func() string) (epochRow, bool) {
	switch {
	case row == nil:
		return epochRow{Epoch: newEpoch(), Timeline: timeline, Synchronous: synchronous}, true
	case row.Timeline != timeline:
		next := epochRow{Epoch: row.Epoch, Timeline: timeline, Synchronous: synchronous}
		if !row.Synchronous {
			next.Epoch = newEpoch()
		}
		return next, true
	case row.Synchronous != synchronous:
		return epochRow{Epoch: row.Epoch, Timeline: timeline, Synchronous: synchronous}, true
	}
	return *row, false
}

// sqlServer reads what the check compares: whether the server can be
// written at all (a standby cannot be checked: the existing read-only
// handling covers it), its timeline, whether it commits synchronously,
// and the row (NULLs when it is missing).
const sqlServer = `
SELECT s.readonly,
       CASE WHEN s.readonly THEN '' ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END,
       ` + sqlSynchronous + `,
       e.epoch, e.timeline, e.synchronous
FROM (SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on' AS readonly) s
LEFT JOIN store_epoch e ON e.id = 1`

// sqlSynchronous is whether the server's commits wait for a standby.
const sqlSynchronous = `(current_setting('synchronous_standby_names') <> ''
         AND current_setting('synchronous_commit') IN ('on', 'remote_write', 'remote_apply'))`

// sqlLockEpoch locks the row, in the check's transaction: concurrent
// connections take turns, and each reads what the one before wrote.
const sqlLockEpoch = `SELECT 1 FROM store_epoch WHERE id = 1 FOR UPDATE`

// sqlInsertEpoch writes the first row; of two connections that found none
// at once (the lock locks no row yet), the first wins and the second
// changes nothing (no row affected).
const sqlInsertEpoch = `
INSERT INTO store_epoch (id, epoch, timeline, synchronous) VALUES (1, $1, $2, $3)
ON CONFLICT (id) DO NOTHING`

const sqlUpdateEpoch = `UPDATE store_epoch SET epoch = $1, timeline = $2, synchronous = $3 WHERE id = 1`

// readServer runs sqlServer on q.
func readServer(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, sql string) (readonly bool, timeline string, synchronous bool, row *epochRow, err error) {
	var epoch, tl *string
	var sync *bool
	if err := q.QueryRow(ctx, sql).Scan(&readonly, &timeline, &synchronous, &epoch, &tl, &sync); err != nil {
		return false, "", false, nil, err
	}
	if epoch != nil {
		row = &epochRow{Epoch: *epoch, Timeline: *tl, Synchronous: *sync}
	}
	return readonly, timeline, synchronous, row, nil
}

// checkTimeline is the check, on conn. It reads without a lock first, and
// writes, in one transaction with the row locked, only when something
// differs: idempotent, and a connection that finds nothing to do locks
// nothing.
func checkTimeline(ctx context.Context, conn *pgx.Conn, log *slog.Logger) error {
	readonly, tl, sync, row, err := readServer(ctx, conn, sqlServer)
	if err != nil {
		return classify("check timeline", err)
	}
	if readonly {
		return nil
	}
	if _, write := nextEpochRow(row, tl, sync, store.NewEpoch); !write {
		return nil
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlLockEpoch); err != nil {
			return err
		}
		readonly, tl, sync, row, err := readServer(ctx, tx, sqlServer)
		if err != nil || readonly {
			return err
		}
		next, write := nextEpochRow(row, tl, sync, store.NewEpoch)
		if !write {
			return nil // another connection did it meanwhile
		}
		if row == nil {
			tag, err := tx.Exec(ctx, sqlInsertEpoch, next.Epoch, next.Timeline, next.Synchronous)
			if err != nil || tag.RowsAffected() == 0 {
				return err // another connection's epoch was kept, and logged there
			}
			log.Info("store epoch recorded", "epoch", next.Epoch, "timeline", next.Timeline, "synchronous", next.Synchronous)
			return nil
		}
		if _, err := tx.Exec(ctx, sqlUpdateEpoch, next.Epoch, next.Timeline, next.Synchronous); err != nil {
			return err
		}
		switch {
		case row.Epoch != next.Epoch:
			log.Warn("the database is on a new timeline and its primary did not commit synchronously: the last commits may be lost, so the store's epoch changes and clients resynchronise",
				"old_timeline", row.Timeline, "timeline", next.Timeline, "old_epoch", row.Epoch, "epoch", next.Epoch)
		case row.Timeline != next.Timeline:
			log.Warn("the database is on a new timeline; its primary committed synchronously, so the epoch stays",
				"old_timeline", row.Timeline, "timeline", next.Timeline, "epoch", next.Epoch)
		default:
			log.Info("the database's synchronous commit changed", "synchronous", next.Synchronous)
		}
		return nil
	})
	return classify("check timeline", err)
}

// sqlHistory reads the epoch and what names the server: its timeline and
// start, and its system identifier where this role may read it (else its
// address and port, below).
const sqlHistory = `
SELECT (SELECT epoch FROM store_epoch WHERE id = 1),
       CASE WHEN pg_is_in_recovery() THEN '' ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END,
       pg_postmaster_start_time()::text,
       coalesce(inet_server_addr()::text, 'local') || ':' || coalesce(inet_server_port()::text, ''),
       ` + sqlSynchronous

const sqlSystemID = `SELECT system_identifier::text FROM pg_control_system()`

// History checks the timeline on a pooled connection (which also records a
// change of synchronous commit since the connection was made), reads the
// epoch and the instance and, when the server commits synchronously,
// confirms that a standby takes its commits (confirm).
func (db *DB) History(ctx context.Context) (store.History, error) {
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return store.History{}, classify("history", err)
	}
	defer conn.Release()
	if err := checkTimeline(ctx, conn.Conn(), db.log); err != nil {
		return store.History{}, err
	}
	var (
		epoch                   *string
		timeline, started, addr string
		synchronous             bool
	)
	if err := conn.QueryRow(ctx, sqlHistory).Scan(&epoch, &timeline, &started, &addr, &synchronous); err != nil {
		return store.History{}, classify("history", err)
	}
	if err := db.confirm(ctx, conn.Conn(), synchronous); err != nil {
		return store.History{}, err
	}
	if epoch == nil {
		return store.History{}, fmt.Errorf("postgres: history: no epoch recorded yet (a standby, before any primary was checked): %w", store.ErrUnavailable)
	}
	server := addr
	if db.systemID.Load() {
		var id string
		err := conn.QueryRow(ctx, sqlSystemID).Scan(&id)
		switch {
		case err == nil:
			server = "system " + id
		case permissionDenied(err):
			db.systemID.Store(false) // not this role's to read: the address names it
		default:
			return store.History{}, classify("history", err)
		}
	}
	return store.History{Epoch: *epoch, Instance: fmt.Sprintf("postgres:%s/timeline %s/started %s", server, timeline, started)}, nil
}

// permissionDenied reports Postgres's insufficient_privilege.
func permissionDenied(err error) bool {
	var pgErr interface{ SQLState() string }
	return errors.As(err, &pgErr) && pgErr.SQLState() == "42501"
}

// Reads on a server whose standby stopped taking its commits. A commit
// whose wait for the standby is cancelled stays on the server, visible:
// a send answered 503 (confirmed) is then there to be read, at a seq that
// a promoted standby gives to another send, which a device that read the
// first skips. So while the server commits synchronously and no standby
// has confirmed History's last write, the store refuses the reads that
// hand out envelopes or positions (Fetch, State): it is stalled. The
// check comes every second and gives up within confirmTimeout, sooner
// than a send's deadline (FN_STORE_TIMEOUT, 5 s) lets its commit become
// visible; a write that outlives its deadline also stalls reads at once.

// confirmTimeout bounds History's confirming write: a synchronous commit
// on a healthy pair takes milliseconds.
const confirmTimeout = time.Second

// sqlConfirm rewrites the epoch's row as it is: a write, whose commit
// waits for the synchronous standby.
const sqlConfirm = `UPDATE store_epoch SET epoch = epoch WHERE id = 1`

// errStalled refuses a read while the server is stalled.
var errStalled = fmt.Errorf("postgres: the synchronous standby has not confirmed a recent write, so what this server shows may be lost in a failover: %w", store.ErrUnavailable)

// confirm records whether the server commits synchronously and, when it
// does, whether a standby confirms a write within confirmTimeout.
func (db *DB) confirm(ctx context.Context, conn *pgx.Conn, synchronous bool) error {
	db.synchronous.Store(synchronous)
	if !synchronous {
		if db.stalled.Swap(false) {
			db.log.Info("the server no longer commits synchronously: polls are served again")
		}
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, confirmTimeout)
	defer cancel()
	_, err := conn.Exec(cctx, sqlConfirm)
	if err == nil {
		err = cctx.Err() // answered only once cancelled: not confirmed
	}
	if err != nil {
		if !db.stalled.Swap(true) {
			db.log.Warn("the synchronous standby does not confirm commits: polls are refused until it does, so that nothing it lacks is handed out", "err", err)
		}
		return classify("history: confirm", err)
	}
	if db.stalled.Swap(false) {
		db.log.Info("the synchronous standby confirms commits again: polls are served again")
	}
	return nil
}
