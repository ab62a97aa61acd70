package sqlite

import (
	"context"
	"database/sql"
	"strings"

	"github.com/flamenet/relay/store"
)

const (
	defaultExpireBatch = 1000
	// maxExpireBatch keeps one batch's DELETE under SQLite's limit on
	// bound parameters.
	maxExpireBatch = 10000
)

// Expire deletes envelopes sent before p.EnvelopesBefore, then send records
// older than p.SendsBefore that no envelope refers to any more. Each batch
// is its own short transaction so that sends are never held up for long.
func (db *DB) Expire(ctx context.Context, p store.ExpireParams) (store.ExpireResult, error) {
	batch := p.Batch
	if batch <= 0 {
		batch = defaultExpireBatch
	}
	batch = min(batch, maxExpireBatch)
	var res store.ExpireResult
	for {
		n, err := db.expireEnvelopes(ctx, micros(p.EnvelopesBefore), batch)
		res.Envelopes += n
		if err != nil {
			return res, err
		}
		if n < int64(batch) {
			break
		}
	}
	for {
		var n int64
		err := db.write(ctx, "expire sends", func(tx *sql.Tx) error {
			r, err := tx.ExecContext(ctx, `DELETE FROM sends WHERE id IN (
				SELECT id FROM sends s WHERE created_at < ?
				AND NOT EXISTS (SELECT 1 FROM envelopes e WHERE e.send_ref = s.id)
				LIMIT ?)`, micros(p.SendsBefore), batch)
			if err != nil {
				return err
			}
			n, err = r.RowsAffected()
			return err
		})
		if err != nil {
			return res, err
		}
		res.Sends += n
		if n < int64(batch) {
			break
		}
	}
	return res, nil
}

// expireEnvelopes deletes one batch and takes the deleted rows off their
// devices' pending counts in the same transaction.
func (db *DB) expireEnvelopes(ctx context.Context, before int64, batch int) (int64, error) {
	var n int64
	err := db.write(ctx, "expire envelopes", func(tx *sql.Tx) error {
		// Only a prefix of each device's seqs goes, so that a poll never
		// sees a hole: a row waits for every lower seq to expire too.
		rows, err := tx.QueryContext(ctx, `SELECT rowid, household, device, size FROM envelopes e
			WHERE sent_at < ? AND NOT EXISTS (SELECT 1 FROM envelopes f
				WHERE f.household = e.household AND f.device = e.device AND f.seq < e.seq AND f.sent_at >= ?)
			LIMIT ?`, before, before, batch)
		if err != nil {
			return err
		}
		type key struct{ household, device string }
		type freed struct{ count, bytes int64 }
		byDevice := map[key]freed{}
		var ids []any
		for rows.Next() {
			var id, size int64
			var k key
			if err := rows.Scan(&id, &k.household, &k.device, &size); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
			f := byDevice[k]
			f.count++
			f.bytes += size
			byDevice[k] = f
		}
		if err := rows.Close(); err != nil {
			return err
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		marks := strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",")
		if _, err := tx.ExecContext(ctx, `DELETE FROM envelopes WHERE rowid IN (`+marks+`)`, ids...); err != nil {
			return err
		}
		for k, f := range byDevice {
			if _, err := tx.ExecContext(ctx, `UPDATE devices
				SET pending_count = pending_count - ?, pending_bytes = pending_bytes - ?
				WHERE household = ? AND name = ?`, f.count, f.bytes, k.household, k.device); err != nil {
				return err
			}
		}
		n = int64(len(ids))
		return nil
	})
	return n, err
}
