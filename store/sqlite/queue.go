package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

// lastSeenStep is how stale last_seen may get before an ack that moves
// nothing writes it anyway: without it every poll would be a write.
const lastSeenStep = time.Minute

// Ack moves the cursor up (never down), deletes what it covers, and
// registers a device it does not know. It reads on a reader first and takes
// the writer only when something must change.
func (db *DB) Ack(ctx context.Context, p store.AckParams) (store.Position, error) {
	var (
		cursor, head, seen int64
		ok                 bool
		epoch              string
	)
	err := db.reader.QueryRowContext(ctx, `SELECT cursor, head, last_seen, `+admitted("?3")+`, (`+sqlEpoch+`) FROM devices
		WHERE household = ?1 AND name = ?2`, p.Household, p.Device, issued(p.IssuedAt)).Scan(&cursor, &head, &seen, &ok, &epoch)
	switch {
	case err == nil && !ok:
		return store.Position{}, fmt.Errorf("sqlite: ack %q: %w", p.Device, store.ErrRemoved)
	case err == nil:
		if p.Epoch != "" && p.Epoch != epoch {
			return store.Position{Cursor: cursor, Head: head, Epoch: epoch}, &store.StaleEpochError{Epoch: epoch}
		}
		if p.Cursor > head {
			return store.Position{Cursor: cursor, Head: head, Epoch: epoch}, &store.CursorAheadError{Head: head}
		}
		if p.Cursor <= cursor && micros(p.Now)-seen < lastSeenStep.Microseconds() {
			return store.Position{Cursor: cursor, Head: head, Epoch: epoch}, nil
		}
	case !errors.Is(err, sql.ErrNoRows):
		return store.Position{}, wrap(ctx, "ack", err)
	}

	var pos store.Position
	var ahead error
	err = db.write(ctx, "ack", func(tx *sql.Tx) error {
		var err error
		if pos.Epoch, err = epochOf(ctx, tx); err != nil {
			return err
		}
		// The removal check and the insert are one statement, under the
		// single writer: a credential older than the last removal never
		// registers the device again. Then read again under the write
		// lock: the reader's row may be a send or an ack behind.
		if _, err := tx.ExecContext(ctx, `INSERT INTO devices (household, name, registered_at, last_seen)
			SELECT ?1, ?2, ?3, ?3 WHERE `+admitted("?4")+` ON CONFLICT (household, name) DO NOTHING`,
			p.Household, p.Device, micros(p.Now), issued(p.IssuedAt)); err != nil {
			return err
		}
		var ok bool
		err = tx.QueryRowContext(ctx, `SELECT cursor, head, `+admitted("?3")+` FROM devices WHERE household = ?1 AND name = ?2`,
			p.Household, p.Device, issued(p.IssuedAt)).Scan(&pos.Cursor, &pos.Head, &ok)
		if errors.Is(err, sql.ErrNoRows) || err == nil && !ok {
			return fmt.Errorf("sqlite: ack %q: %w", p.Device, store.ErrRemoved)
		}
		if err != nil {
			return err
		}
		if p.Epoch != "" && p.Epoch != pos.Epoch {
			// Commit the registration all the same, as for a cursor ahead.
			ahead = &store.StaleEpochError{Epoch: pos.Epoch}
			return nil
		}
		if p.Cursor > pos.Head {
			// Commit the registration all the same: the device did call.
			ahead = &store.CursorAheadError{Head: pos.Head}
			return nil
		}
		if p.Cursor > pos.Cursor {
			var n, size int64
			if err := tx.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(size), 0) FROM envelopes
				WHERE household = ? AND device = ? AND seq <= ?`, p.Household, p.Device, p.Cursor).Scan(&n, &size); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM envelopes WHERE household = ? AND device = ? AND seq <= ?`,
				p.Household, p.Device, p.Cursor); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `UPDATE devices
				SET cursor = ?, pending_count = pending_count - ?, pending_bytes = pending_bytes - ?
				WHERE household = ? AND name = ?`, p.Cursor, n, size, p.Household, p.Device); err != nil {
				return err
			}
			pos.Cursor = p.Cursor
			pos.Acked = n
		}
		_, err = tx.ExecContext(ctx, `UPDATE devices SET last_seen = max(last_seen, ?) WHERE household = ? AND name = ?`,
			micros(p.Now), p.Household, p.Device)
		return err
	})
	if err != nil {
		return store.Position{}, err
	}
	return pos, ahead
}

// Fetch reads ids and sizes above p.After first, picks the prefix inside
// the budget, and only then loads payloads, and only that prefix's: a
// device with a deep queue of large envelopes costs one budget of reading,
// not its whole queue. Both reads share one snapshot, so an ack or expiry
// between them cannot change the rows picked.
func (db *DB) Fetch(ctx context.Context, p store.FetchParams) (store.Batch, error) {
	var b store.Batch
	err := db.read(ctx, "fetch", func(tx *sql.Tx) error {
		limit := int64(-1) // SQLite: no limit
		if p.Limit > 0 {
			limit = int64(p.Limit) + 1 // one more tells whether more waits
		}
		rows, err := tx.QueryContext(ctx, `SELECT seq, size FROM envelopes
			WHERE household = ? AND device = ? AND seq > ? ORDER BY seq LIMIT ?`,
			p.Household, p.Device, p.After, limit)
		if err != nil {
			return err
		}
		var seqs, sizes []int64
		for rows.Next() {
			var seq, size int64
			if err := rows.Scan(&seq, &size); err != nil {
				rows.Close()
				return err
			}
			seqs = append(seqs, seq)
			sizes = append(sizes, size)
		}
		if err := rows.Close(); err != nil {
			return err
		}
		if err := rows.Err(); err != nil {
			return err
		}
		n, more := prefix(sizes, p.Limit, p.Budget)
		b.More = more
		// The removal and the epoch, in the snapshot that read (and will
		// load) the rows.
		if b.Life, err = life(ctx, tx, p.Household, p.Device); err != nil {
			return err
		}
		if b.Epoch, err = epochOf(ctx, tx); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}

		// Payloads of the picked prefix only.
		rows, err = tx.QueryContext(ctx, `SELECT seq, send_id, sender, sent_at, payload FROM envelopes
			WHERE household = ? AND device = ? AND seq > ? AND seq <= ? ORDER BY seq`,
			p.Household, p.Device, p.After, seqs[n-1])
		if err != nil {
			return err
		}
		defer rows.Close()
		b.Envelopes = make([]store.Envelope, 0, n)
		for rows.Next() {
			var e store.Envelope
			var sent int64
			if err := rows.Scan(&e.Seq, &e.ID, &e.From, &sent, &e.Payload); err != nil {
				return err
			}
			e.SentAt = fromMicros(sent)
			b.Envelopes = append(b.Envelopes, e)
		}
		return rows.Err()
	})
	if err != nil {
		return store.Batch{}, err
	}
	return b, nil
}

// life reads the life a device is in: begun by its last removal, if any.
func life(ctx context.Context, q querier, household, name string) (device.Life, error) {
	var at int64
	err := q.QueryRowContext(ctx, `SELECT removed_at FROM removals WHERE household = ? AND device = ?`,
		household, name).Scan(&at)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return device.Life{}, nil
	case err != nil:
		return device.Life{}, err
	}
	return device.LifeAfter(fromMicros(at)), nil
}

// State reads where a device stands, in one statement on a reader.
func (db *DB) State(ctx context.Context, household, name string) (store.DeviceState, error) {
	var (
		cursor, head, removed sql.NullInt64
		epoch                 string
	)
	err := db.reader.QueryRowContext(ctx, `SELECT d.cursor, d.head,
			(SELECT removed_at FROM removals WHERE household = ?1 AND device = ?2), (`+sqlEpoch+`)
		FROM (SELECT 1) LEFT JOIN devices d ON d.household = ?1 AND d.name = ?2`,
		household, name).Scan(&cursor, &head, &removed, &epoch)
	if err != nil {
		return store.DeviceState{}, wrap(ctx, "state", err)
	}
	st := store.DeviceState{Exists: cursor.Valid, Cursor: cursor.Int64, Head: head.Int64, Epoch: epoch}
	if removed.Valid {
		st.Life = device.LifeAfter(fromMicros(removed.Int64))
	}
	return st, nil
}

// AckMany applies a batch of acks as one job of a group commit: one write
// transaction, committed with whatever sends wait beside it. Acks of
// another epoch than the one the transaction reads are skipped.
func (db *DB) AckMany(ctx context.Context, acks []store.Ack) (store.AckManyResult, error) {
	if len(acks) == 0 {
		return store.AckManyResult{}, nil
	}
	var res store.AckManyResult
	j := &job{op: "ack many", run: func(ctx context.Context, q querier) error {
		res = store.AckManyResult{}
		epoch, err := epochOf(ctx, q)
		if err != nil {
			return err
		}
		// One entry per device: the highest cursor, the latest time.
		type key struct{ household, device string }
		type want struct {
			cursor  int64
			seen    int64 // Unix microseconds; 0: leave last_seen
			removed int64 // Unix microseconds; 0: never removed, as the caller knew
		}
		merged := make(map[key]want, len(acks))
		order := make([]key, 0, len(acks))
		for _, a := range acks {
			if a.Epoch != "" && a.Epoch != epoch {
				res.Stale++
				continue
			}
			k := key{a.Household, a.Device}
			w, ok := merged[k]
			if !ok {
				order = append(order, k)
				w.cursor = a.Cursor
			}
			w.cursor = max(w.cursor, a.Cursor)
			if !a.Seen.IsZero() {
				w.seen = max(w.seen, micros(a.Seen))
			}
			if at := a.Life.RemovedAt(); !at.IsZero() {
				w.removed = max(w.removed, micros(at))
			}
			merged[k] = w
		}
		for _, k := range order {
			w := merged[k]
			var cursor, head, seen, removed int64
			err := q.QueryRowContext(ctx, `SELECT d.cursor, d.head, d.last_seen, coalesce(r.removed_at, 0)
				FROM devices d LEFT JOIN removals r ON r.household = d.household AND r.device = d.name
				WHERE d.household = ? AND d.name = ?`,
				k.household, k.device).Scan(&cursor, &head, &seen, &removed)
			if errors.Is(err, sql.ErrNoRows) {
				continue // not registered (or removed): skipped, never created
			}
			if err != nil {
				return err
			}
			if removed > w.removed {
				continue // taken before a removal the caller had not heard of
			}
			// Up only, and never past the head.
			to := max(cursor, min(w.cursor, head))
			if to > cursor {
				var n, size int64
				if err := q.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(size), 0) FROM envelopes
					WHERE household = ? AND device = ? AND seq > ? AND seq <= ?`, k.household, k.device, cursor, to).Scan(&n, &size); err != nil {
					return err
				}
				if _, err := q.ExecContext(ctx, `DELETE FROM envelopes WHERE household = ? AND device = ? AND seq > ? AND seq <= ?`,
					k.household, k.device, cursor, to); err != nil {
					return err
				}
				if _, err := q.ExecContext(ctx, `UPDATE devices
					SET cursor = ?, pending_count = pending_count - ?, pending_bytes = pending_bytes - ?
					WHERE household = ? AND name = ?`, to, n, size, k.household, k.device); err != nil {
					return err
				}
				res.Deleted += n
			}
			if w.seen > seen {
				if _, err := q.ExecContext(ctx, `UPDATE devices SET last_seen = ? WHERE household = ? AND name = ?`,
					w.seen, k.household, k.device); err != nil {
					return err
				}
			}
		}
		return nil
	}}
	if err := db.submit(ctx, j); err != nil {
		return store.AckManyResult{}, err
	}
	return res, nil
}

// prefix picks how many of the envelopes with these sizes (in seq order) one
// fetch returns: at most limit, the longest run whose sizes fit in budget,
// and always the first whatever its size. more reports that some are left.
// A limit or budget of zero or less does not bound.
func prefix(sizes []int64, limit int, budget int64) (n int, more bool) {
	var total int64
	for _, s := range sizes {
		if limit > 0 && n >= limit {
			break
		}
		if n > 0 && budget > 0 && total+s > budget {
			break
		}
		total += s
		n++
	}
	return n, n < len(sizes)
}
