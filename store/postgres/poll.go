package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

// lastSeenEvery is how stale last_seen may get before an ack that moves
// nothing writes it anyway: a poll every few seconds must not cost a write.
const lastSeenEvery = time.Minute

// sqlSizes is a poll's first read: seqs and sizes only, from the primary
// key's index (which includes size), one more row than the limit so that
// "more" needs no second query. It also reads the device's last removal,
// and returns it on a row of its own (seq NULL) when no envelope waits.
const sqlSizes = `
SELECT r.removed_at, e.seq, e.size
FROM (SELECT (SELECT removed_at FROM removals WHERE household = $1 AND device = $2) AS removed_at) r
LEFT JOIN LATERAL (
    SELECT seq, size FROM envelopes
    WHERE household = $1 AND device = $2 AND seq > $3
    ORDER BY seq
    LIMIT $4) e ON true
ORDER BY e.seq`

// sqlPayloads loads the rows the budget admitted, a range of the same
// index, and reads the device's last removal in the same snapshot: a row
// of a device registered again since the first read comes with its
// removal.
const sqlPayloads = `
SELECT seq, send_id, sender, sent_at, payload,
       (SELECT removed_at FROM removals WHERE household = $1 AND device = $2)
FROM envelopes
WHERE household = $1 AND device = $2 AND seq > $3 AND seq <= $4
ORDER BY seq`

// Fetch reads ids and sizes above p.After, picks the prefix inside the
// budget (always at least one row), then loads only those payloads.
func (db *DB) Fetch(ctx context.Context, p store.FetchParams) (store.Batch, error) {
	var limit any // NULL: no limit
	if p.Limit > 0 {
		limit = int64(p.Limit) + 1
	}
	rows, err := db.pool.Query(ctx, sqlSizes, p.Household, p.Device, p.After, limit)
	if err != nil {
		return store.Batch{}, classify("fetch: sizes", err)
	}
	type sized struct{ seq, size int64 }
	var (
		list      []sized
		removedAt *time.Time
		seq, size *int64
	)
	_, err = pgx.ForEachRow(rows, []any{&removedAt, &seq, &size}, func() error {
		if seq != nil {
			list = append(list, sized{*seq, *size})
		}
		return nil
	})
	if err != nil {
		return store.Batch{}, classify("fetch: sizes", err)
	}

	n, total := 0, int64(0)
	for _, s := range list {
		if p.Limit > 0 && n == p.Limit {
			break
		}
		if n > 0 && p.Budget > 0 && total+s.size > p.Budget {
			break
		}
		n++
		total += s.size
	}
	batch := store.Batch{More: n < len(list), Life: device.LifeAfter(utc(removedAt))}
	if n == 0 {
		return batch, nil
	}

	// Rows inside the range cannot appear later (seqs are given in commit
	// order); a concurrent ack may delete some, and they are simply absent.
	rows, err = db.pool.Query(ctx, sqlPayloads, p.Household, p.Device, p.After, list[n-1].seq)
	if err != nil {
		return store.Batch{}, classify("fetch: payloads", err)
	}
	var e store.Envelope
	_, err = pgx.ForEachRow(rows, []any{&e.Seq, &e.ID, &e.From, &e.SentAt, &e.Payload, &removedAt}, func() error {
		e.SentAt = e.SentAt.UTC()
		batch.Envelopes = append(batch.Envelopes, e)
		e = store.Envelope{} // Scan reuses the payload slice otherwise
		batch.Life = device.LifeAfter(utc(removedAt))
		return nil
	})
	if err != nil {
		return store.Batch{}, classify("fetch: payloads", err)
	}
	return batch, nil
}

// utc returns *t in UTC, or the zero time for NULL.
func utc(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// sqlState reads a device's position and last removal in one statement:
// one row whether or not the device exists.
const sqlState = `
SELECT d.cursor, d.head, (SELECT removed_at FROM removals WHERE household = $1 AND device = $2)
FROM (VALUES (1)) AS one (x)
LEFT JOIN devices d ON d.household = $1 AND d.name = $2`

// State reads where a device stands, in one query, writing nothing.
func (db *DB) State(ctx context.Context, household, name string) (store.DeviceState, error) {
	var (
		cursor, head *int64
		removedAt    *time.Time
	)
	if err := db.pool.QueryRow(ctx, sqlState, household, name).Scan(&cursor, &head, &removedAt); err != nil {
		return store.DeviceState{}, classify("state", err)
	}
	st := store.DeviceState{Exists: cursor != nil, Life: device.LifeAfter(utc(removedAt))}
	if st.Exists {
		st.Cursor, st.Head = *cursor, *head
	}
	return st, nil
}

// sqlAckMany is a batch of acks: relay_ack_many (migration 0002) locks the
// devices that exist in (household, name) order, then deletes what the new
// cursors cover and moves cursors, counters and last_seen, in one call.
const sqlAckMany = `SELECT relay_ack_many($1, $2, $3, $4, $5)`

// AckMany applies a batch of acks in one statement, one round trip.
func (db *DB) AckMany(ctx context.Context, acks []store.Ack) (int64, error) {
	if len(acks) == 0 {
		return 0, nil
	}
	households := make([]string, len(acks))
	devices := make([]string, len(acks))
	cursors := make([]int64, len(acks))
	seen := make([]pgtype.Timestamptz, len(acks))
	removed := make([]pgtype.Timestamptz, len(acks))
	for i, a := range acks {
		households[i], devices[i], cursors[i] = a.Household, a.Device, a.Cursor
		if !a.Seen.IsZero() {
			seen[i] = pgtype.Timestamptz{Time: micro(a.Seen), Valid: true}
		}
		if at := a.Life.RemovedAt(); !at.IsZero() {
			removed[i] = pgtype.Timestamptz{Time: micro(at), Valid: true}
		}
	}
	var deleted int64
	if err := db.pool.QueryRow(ctx, sqlAckMany, households, devices, cursors, seen, removed).Scan(&deleted); err != nil {
		return 0, classify("ack many", err)
	}
	return deleted, nil
}

// sqlPosition reads a device's position, and whether the credential
// issued at $3 may act on it.
var sqlPosition = `
SELECT cursor, head, last_seen, ` + sqlAdmitted("$3") + ` FROM devices
WHERE household = $1 AND name = $2`

// sqlCreateDevice is a device's implicit registration by its first poll
// or ack, run after sqlLockName: the removal check and the insert are one
// statement, so that a credential older than the last removal never
// registers the device again.
var sqlCreateDevice = `
INSERT INTO devices (household, name, registered_at, last_seen)
SELECT $1, $2, $3::timestamptz, $3::timestamptz
WHERE ` + sqlAdmitted("$4") + `
ON CONFLICT (household, name) DO NOTHING`

// sqlMoveCursor locks the device row first: whoever deletes a device's
// envelopes holds its row, so envelope deletions never wait on each other
// in different orders (see docs/FANOUT.md).
const sqlMoveCursor = `
UPDATE devices
SET cursor = GREATEST(cursor, $3), last_seen = GREATEST(last_seen, $4)
WHERE household = $1 AND name = $2
RETURNING cursor, head`

// sqlDeleteAcked deletes the newly acknowledged range and takes it off the
// pending counters. Rows below the old cursor went when it moved there.
const sqlDeleteAcked = `
WITH gone AS (
    DELETE FROM envelopes
    WHERE household = $1 AND device = $2 AND seq > $3 AND seq <= $4
    RETURNING size
)
UPDATE devices
SET pending_count = pending_count - (SELECT count(*) FROM gone),
    pending_bytes = pending_bytes - (SELECT coalesce(sum(size), 0) FROM gone)
WHERE household = $1 AND name = $2
RETURNING (SELECT count(*) FROM gone)`

// Ack moves the cursor up to p.Cursor and deletes what it covers. It reads
// first and writes only when the cursor moves, the device is new, or
// last_seen is over a minute old, so that polls that move nothing stay
// reads.
func (db *DB) Ack(ctx context.Context, p store.AckParams) (store.Position, error) {
	now := micro(p.Now)
	var (
		pos      store.Position
		lastSeen time.Time
		admitted bool
	)
	cred := issued(p.IssuedAt)
	err := db.pool.QueryRow(ctx, sqlPosition, p.Household, p.Device, cred).Scan(&pos.Cursor, &pos.Head, &lastSeen, &admitted)
	if errors.Is(err, pgx.ErrNoRows) {
		b := &pgx.Batch{}
		b.Queue(sqlLockName, p.Household, p.Device)
		b.Queue(sqlCreateDevice, p.Household, p.Device, now, cred)
		// One implicit transaction: the lock is held until the insert
		// commits.
		if err := db.pool.SendBatch(ctx, b).Close(); err != nil {
			return store.Position{}, classify("ack: create device", err)
		}
		// Read again: a concurrent register may have won, with its own
		// row, or the removal check kept the device out.
		err = db.pool.QueryRow(ctx, sqlPosition, p.Household, p.Device, cred).Scan(&pos.Cursor, &pos.Head, &lastSeen, &admitted)
		if errors.Is(err, pgx.ErrNoRows) {
			admitted = false
			err = nil
		}
	}
	if err != nil {
		return store.Position{}, classify("ack: read", err)
	}
	if !admitted {
		return store.Position{}, fmt.Errorf("postgres: ack %q: %w", p.Device, store.ErrRemoved)
	}
	// head only grows, so a cursor within this head stays within it.
	if p.Cursor > pos.Head {
		return pos, fmt.Errorf("postgres: ack: %w", &store.CursorAheadError{Head: pos.Head})
	}
	moves := p.Cursor > pos.Cursor
	if !moves && now.Sub(lastSeen) < lastSeenEvery {
		return pos, nil
	}

	b := &pgx.Batch{}
	b.Queue(sqlMoveCursor, p.Household, p.Device, max(p.Cursor, 0), now).QueryRow(func(row pgx.Row) error {
		return row.Scan(&pos.Cursor, &pos.Head)
	})
	if moves {
		b.Queue(sqlDeleteAcked, p.Household, p.Device, pos.Cursor, p.Cursor).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&pos.Acked)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // the device went away meanwhile: nothing deleted
			}
			return err
		})
	}
	// A batch without BEGIN runs as one implicit transaction: the cursor
	// and the deletion commit together or not at all.
	if err := db.pool.SendBatch(ctx, b).Close(); err != nil {
		return store.Position{}, classify("ack: write", err)
	}
	return pos, nil
}
