package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flamenet/relay/store"
)

// defaultExpireBatch applies when ExpireParams.Batch is not positive.
const defaultExpireBatch = 1000

// sqlExpiredEnvelopes picks the oldest expired envelopes by the sent_at
// index. It locks nothing; the rows are re-checked when deleted. Only a
// prefix of each device's seqs goes, so that a poll never sees a hole: a
// row waits for every lower seq to expire too.
const sqlExpiredEnvelopes = `
SELECT household, device, seq FROM envelopes e
WHERE sent_at < $1
  AND NOT EXISTS (SELECT 1 FROM envelopes f
      WHERE f.household = e.household AND f.device = e.device AND f.seq < e.seq AND f.sent_at >= $1)
ORDER BY sent_at
LIMIT $2`

// sqlLockOwners locks the owners of a batch of envelopes in (household,
// name) order, the order sends lock in, before any envelope is touched.
const sqlLockOwners = `
SELECT 1 FROM devices
WHERE (household, name) IN (SELECT * FROM unnest($1::text[], $2::text[]))
ORDER BY household, name
FOR UPDATE`

// sqlDeleteExpired deletes the batch (minus rows an ack took meanwhile) and
// takes it off its owners' pending counters.
const sqlDeleteExpired = `
WITH gone AS (
    DELETE FROM envelopes e
    USING unnest($1::text[], $2::text[], $3::bigint[]) AS v(household, device, seq)
    WHERE e.household = v.household AND e.device = v.device AND e.seq = v.seq
      AND e.sent_at < $4
    RETURNING e.household, e.device, e.size
), owners AS (
    SELECT household, device, count(*) AS n, sum(size) AS bytes
    FROM gone GROUP BY household, device
), adjusted AS (
    UPDATE devices d
    SET pending_count = d.pending_count - o.n,
        pending_bytes = d.pending_bytes - o.bytes
    FROM owners o
    WHERE d.household = o.household AND d.name = o.device
)
SELECT count(*) FROM gone`

// sqlExpireSends pages through old send records by (created_at, id) and
// deletes those with no envelope left. Paging, rather than rescanning from
// the oldest, steps over old sends that still have envelopes waiting.
const sqlExpireSends = `
WITH page AS (
    SELECT id, created_at FROM sends
    WHERE created_at < $1 AND (created_at, id) > ($2, $3)
    ORDER BY created_at, id
    LIMIT $4
), gone AS (
    DELETE FROM sends
    WHERE id = ANY (ARRAY(
        SELECT id FROM page
        WHERE NOT EXISTS (SELECT 1 FROM envelopes e WHERE e.send_ref = page.id)))
    RETURNING id
)
SELECT count(*), (SELECT count(*) FROM gone),
       max(created_at), (array_agg(id ORDER BY created_at DESC, id DESC))[1]
FROM page`

// Expire deletes expired envelopes, then send records, in batches of at
// most p.Batch rows, each batch its own short transaction, so that it never
// holds a row a send needs for long.
func (db *DB) Expire(ctx context.Context, p store.ExpireParams) (store.ExpireResult, error) {
	n := p.Batch
	if n <= 0 {
		n = defaultExpireBatch
	}
	var res store.ExpireResult
	if !p.EnvelopesBefore.IsZero() {
		before := micro(p.EnvelopesBefore)
		for {
			picked, deleted, err := db.expireEnvelopes(ctx, before, n)
			res.Envelopes += deleted
			if err != nil {
				return res, err
			}
			if picked < n {
				break
			}
		}
	}
	if !p.SendsBefore.IsZero() {
		before := micro(p.SendsBefore)
		var (
			afterAt time.Time
			afterID int64
		)
		for {
			var (
				scanned, deleted int64
				lastAt           *time.Time
				lastID           *int64
			)
			err := db.pool.QueryRow(ctx, sqlExpireSends, before, afterAt, afterID, n).
				Scan(&scanned, &deleted, &lastAt, &lastID)
			if err != nil {
				return res, classify("expire: sends", err)
			}
			res.Sends += deleted
			if scanned < int64(n) {
				break
			}
			afterAt, afterID = *lastAt, *lastID
		}
	}
	return res, nil
}

// expireEnvelopes runs one batch and reports how many rows it picked and
// how many it deleted.
func (db *DB) expireEnvelopes(ctx context.Context, before time.Time, n int) (picked int, deleted int64, err error) {
	rows, err := db.pool.Query(ctx, sqlExpiredEnvelopes, before, n)
	if err != nil {
		return 0, 0, classify("expire: envelopes", err)
	}
	var (
		households, devices []string
		seqs                []int64
		h, d                string
		seq                 int64
	)
	_, err = pgx.ForEachRow(rows, []any{&h, &d, &seq}, func() error {
		households, devices, seqs = append(households, h), append(devices, d), append(seqs, seq)
		return nil
	})
	if err != nil {
		return 0, 0, classify("expire: envelopes", err)
	}
	if len(seqs) == 0 {
		return 0, 0, nil
	}

	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(sqlLockOwners, households, devices)
	b.Queue(sqlDeleteExpired, households, devices, seqs, before).QueryRow(func(row pgx.Row) error {
		return row.Scan(&deleted)
	})
	br := db.pool.SendBatch(ctx, b)
	tx := br.Tx()
	defer rollback(ctx, tx)
	if err := br.Close(); err != nil {
		return 0, 0, classify("expire: envelopes", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, classify("expire: envelopes: commit", err)
	}
	return len(seqs), deleted, nil
}
