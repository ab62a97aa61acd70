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
var sqlSizes = `
SELECT r.removed_at, r.epoch, e.seq, e.size
FROM (SELECT (SELECT removed_at FROM removals WHERE household = $1 AND device = $2) AS removed_at,
             (` + sqlEpoch + `) AS epoch) r
LEFT JOIN LATERAL (
    SELECT seq, size FROM envelopes
    WHERE household = $1 AND device = $2 AND seq > $3
    ORDER BY seq
    LIMIT $4) e ON true
ORDER BY e.seq`

// sqlPayloads loads the rows the budget admitted, a range of the same
// index, and reads the device's last removal in the same snapshot: a row
// of a device registered again since the first read comes with its
// removal, and the epoch.
var sqlPayloads = `
SELECT seq, send_id, sender, sent_at, payload,
       (SELECT removed_at FROM removals WHERE household = $1 AND device = $2), (` + sqlEpoch + `)
FROM envelopes
WHERE household = $1 AND device = $2 AND seq > $3 AND seq <= $4
ORDER BY seq`

// Fetch reads ids and sizes above p.After, picks the prefix inside the
// budget (always at least one row), then loads only those payloads.
func (db *DB) Fetch(ctx context.Context, p store.FetchParams) (store.Batch, error) {
	if db.stalled.Load() {
		return store.Batch{}, errStalled
	}
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
		epoch     *string
		seq, size *int64
	)
	_, err = pgx.ForEachRow(rows, []any{&removedAt, &epoch, &seq, &size}, func() error {
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
	batch := store.Batch{More: n < len(list), Life: device.LifeAfter(utc(removedAt)), Epoch: str(epoch)}
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
	_, err = pgx.ForEachRow(rows, []any{&e.Seq, &e.ID, &e.From, &e.SentAt, &e.Payload, &removedAt, &epoch}, func() error {
		e.SentAt = e.SentAt.UTC()
		batch.Envelopes = append(batch.Envelopes, e)
		e = store.Envelope{} // Scan reuses the payload slice otherwise
		batch.Life = device.LifeAfter(utc(removedAt))
		batch.Epoch = str(epoch)
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

// str returns *s, or "" for NULL.
func str(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// sqlEpoch reads the store's epoch (migration 0005), as a subquery.
const sqlEpoch = `SELECT epoch FROM store_epoch WHERE id = 1`

// sqlState reads a device's position, last removal and the epoch in one
// statement: one row whether or not the device exists.
const sqlState = `
SELECT d.cursor, d.head, (SELECT removed_at FROM removals WHERE household = $1 AND device = $2), (` + sqlEpoch + `)
FROM (VALUES (1)) AS one (x)
LEFT JOIN devices d ON d.household = $1 AND d.name = $2`

// State reads where a device stands, in one query, writing nothing.
func (db *DB) State(ctx context.Context, household, name string) (store.DeviceState, error) {
	if db.stalled.Load() {
		return store.DeviceState{}, errStalled
	}
	var (
		cursor, head *int64
		removedAt    *time.Time
		epoch        *string
	)
	if err := db.pool.QueryRow(ctx, sqlState, household, name).Scan(&cursor, &head, &removedAt, &epoch); err != nil {
		return store.DeviceState{}, classify("state", err)
	}
	st := store.DeviceState{Exists: cursor != nil, Life: device.LifeAfter(utc(removedAt)), Epoch: str(epoch)}
	if st.Exists {
		st.Cursor, st.Head = *cursor, *head
	}
	return st, nil
}

// sqlAckMany is a batch of acks: relay_ack_many (migration 0002) locks the
// devices that exist in (household, name) order, then deletes what the new
// cursors cover and moves cursors, counters and last_seen, in one call. It
// is given only the acks of the current epoch, read in the same statement
// (the epoch changes only on a new server, whose connections all checked
// it before running anything: no ack meets a change in flight); the
// others are counted.
const sqlAckMany = `
WITH a AS (
    SELECT u.*, (u.epoch = '' OR u.epoch = (SELECT epoch FROM store_epoch WHERE id = 1)) AS current
    FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[], $5::timestamptz[], $6::text[])
        AS u(household, device, cursor, seen, removed, epoch)
)
SELECT relay_ack_many(
           coalesce(array_agg(household) FILTER (WHERE current), '{}'),
           coalesce(array_agg(device) FILTER (WHERE current), '{}'),
           coalesce(array_agg(cursor) FILTER (WHERE current), '{}'),
           coalesce(array_agg(seen) FILTER (WHERE current), '{}'),
           coalesce(array_agg(removed) FILTER (WHERE current), '{}')),
       count(*) FILTER (WHERE NOT current)
FROM a`

// AckMany applies a batch of acks in one statement, one round trip.
func (db *DB) AckMany(ctx context.Context, acks []store.Ack) (store.AckManyResult, error) {
	if len(acks) == 0 {
		return store.AckManyResult{}, nil
	}
	households := make([]string, len(acks))
	devices := make([]string, len(acks))
	cursors := make([]int64, len(acks))
	seen := make([]pgtype.Timestamptz, len(acks))
	removed := make([]pgtype.Timestamptz, len(acks))
	epochs := make([]string, len(acks))
	for i, a := range acks {
		households[i], devices[i], cursors[i], epochs[i] = a.Household, a.Device, a.Cursor, a.Epoch
		if !a.Seen.IsZero() {
			seen[i] = pgtype.Timestamptz{Time: micro(a.Seen), Valid: true}
		}
		if at := a.Life.RemovedAt(); !at.IsZero() {
			removed[i] = pgtype.Timestamptz{Time: micro(at), Valid: true}
		}
	}
	var (
		res   store.AckManyResult
		stale int64
	)
	if err := db.pool.QueryRow(ctx, sqlAckMany, households, devices, cursors, seen, removed, epochs).Scan(&res.Deleted, &stale); err != nil {
		return store.AckManyResult{}, classify("ack many", err)
	}
	res.Stale = int(stale)
	return res, nil
}

// sqlPosition reads a device's position, and whether the credential
// issued at $3 may act on it.
var sqlPosition = `
SELECT cursor, head, last_seen, ` + sqlAdmitted("$3") + `, (` + sqlEpoch + `) FROM devices
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

// sqlCurrentEpoch is true when the epoch $5 is empty (not checked) or the
// current one: an ack's writes are conditional on it, in their statements.
const sqlCurrentEpoch = `EXISTS (SELECT 1 FROM store_epoch WHERE id = 1 AND ($5 = '' OR epoch = $5))`

// sqlMoveCursor locks the device row first: whoever deletes a device's
// envelopes holds its row, so envelope deletions never wait on each other
// in different orders (see docs/FANOUT.md).
const sqlMoveCursor = `
UPDATE devices
SET cursor = GREATEST(cursor, $3), last_seen = GREATEST(last_seen, $4)
WHERE household = $1 AND name = $2 AND ` + sqlCurrentEpoch + `
RETURNING cursor, head`

// sqlDeleteAcked deletes the newly acknowledged range and takes it off the
// pending counters. Rows below the old cursor went when it moved there.
var sqlDeleteAcked = `
WITH gone AS (
    DELETE FROM envelopes
    WHERE household = $1 AND device = $2 AND seq > $3 AND seq <= $4 AND ` + sqlCurrentEpoch + `
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
		epoch    *string
	)
	cred := issued(p.IssuedAt)
	err := db.pool.QueryRow(ctx, sqlPosition, p.Household, p.Device, cred).Scan(&pos.Cursor, &pos.Head, &lastSeen, &admitted, &epoch)
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
		err = db.pool.QueryRow(ctx, sqlPosition, p.Household, p.Device, cred).Scan(&pos.Cursor, &pos.Head, &lastSeen, &admitted, &epoch)
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
	pos.Epoch = str(epoch)
	if p.Epoch != "" && p.Epoch != pos.Epoch {
		return pos, fmt.Errorf("postgres: ack: %w", &store.StaleEpochError{Epoch: pos.Epoch})
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
	stale := false
	b.Queue(sqlMoveCursor, p.Household, p.Device, max(p.Cursor, 0), now, p.Epoch).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&pos.Cursor, &pos.Head)
		if errors.Is(err, pgx.ErrNoRows) && p.Epoch != "" {
			stale = true // the epoch changed since the read: nothing moved
			return nil
		}
		return err
	})
	if moves {
		b.Queue(sqlDeleteAcked, p.Household, p.Device, pos.Cursor, p.Cursor, p.Epoch).QueryRow(func(row pgx.Row) error {
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
	if stale {
		st, err := db.State(ctx, p.Household, p.Device)
		if err != nil {
			return store.Position{}, err
		}
		return store.Position{Cursor: st.Cursor, Head: st.Head, Epoch: st.Epoch}, fmt.Errorf("postgres: ack: %w", &store.StaleEpochError{Epoch: st.Epoch})
	}
	return pos, nil
}
