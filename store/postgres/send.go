package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/flamenet/relay/store"
)

// sqlClaim records the send's dedupe key. A concurrent identical send waits
// here on the unique index until the first commits (then it gets no row and
// reads the stored answer) or rolls back (then it claims the key itself).
const sqlClaim = `
INSERT INTO sends (household, sender, send_id, digest, created_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (household, sender, send_id) DO NOTHING
RETURNING id`

// sqlStored reads the answer of a send that claimed the key first. It is a
// statement of its own: the claim's snapshot predates the commit it waited
// for and cannot see that row.
const sqlStored = `
SELECT digest, deliveries FROM sends
WHERE household = $1 AND sender = $2 AND send_id = $3`

// sqlLockRecipients locks the recipients' rows in name order and holds them
// until commit. Every send locks in this one order, so two sends whose
// recipients overlap queue behind each other instead of deadlocking.
const sqlLockRecipients = `
SELECT name, head, pending_count, pending_bytes, push_kind, push_address
FROM devices
WHERE household = $1 AND name = ANY($2::text[])
ORDER BY name
FOR UPDATE`

// sqlDeliver gives each locked recipient its next seq, stores its copy and
// records the answer for repeats, in one statement.
const sqlDeliver = `
WITH bumped AS (
    UPDATE devices
    SET head = head + 1,
        pending_count = pending_count + 1,
        pending_bytes = pending_bytes + $3
    WHERE household = $1 AND name = ANY($2::text[])
    RETURNING name, head
), stored AS (
    INSERT INTO envelopes (household, device, seq, send_ref, sender, send_id, sent_at, size, payload)
    SELECT $1, name, head, $4, $5, $6, $7, $3, $8 FROM bumped
), answered AS (
    UPDATE sends
    SET deliveries = (SELECT jsonb_agg(jsonb_build_object('device', name, 'seq', head)) FROM bumped)
    WHERE id = $4
)
SELECT name, head FROM bumped`

// recipient is a locked device row as a send sees it.
type recipient struct {
	name         string
	head         int64
	pendingCount int64
	pendingBytes int64
	push         store.PushTarget
}

// storedDelivery is one element of sends.deliveries.
type storedDelivery struct {
	Device string `json:"device"`
	Seq    int64  `json:"seq"`
}

// Send stores one envelope per recipient in one transaction and three round
// trips: begin, claim and lock in one batch; the checks in Go; one statement
// that writes everything; commit.
func (db *DB) Send(ctx context.Context, p store.SendParams) (store.SendResult, error) {
	// The contract hands To sorted and unique; normalising again costs
	// little and keeps the lock order whatever the caller did.
	to := store.Recipients(p.To)
	if len(to) == 0 {
		return store.SendResult{}, errors.New("postgres: send: no recipients")
	}
	sum := store.Digest(to, p.Payload)
	dig := sum[:]
	now := micro(p.Now)

	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(sqlClaim, p.Household, p.Sender, p.ID, dig, now)
	b.Queue(sqlLockRecipients, p.Household, to)
	br := db.pool.SendBatch(ctx, b)
	tx := br.Tx()
	defer rollback(ctx, tx)

	ref, claimed, locked, err := readClaimAndLock(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return store.SendResult{}, classify("send", err)
	}
	if !claimed {
		return db.repeat(ctx, tx, p, dig)
	}

	if err := check(p, to, locked); err != nil {
		return store.SendResult{}, err
	}

	size := int64(len(p.Payload))
	rows, err := tx.Query(ctx, sqlDeliver, p.Household, to, size, ref, p.Sender, p.ID, now, p.Payload)
	if err != nil {
		return store.SendResult{}, classify("send: deliver", err)
	}
	seqs := make(map[string]int64, len(to))
	var (
		name string
		seq  int64
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &seq}, func() error {
		seqs[name] = seq
		return nil
	})
	if err != nil {
		return store.SendResult{}, classify("send: deliver", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return store.SendResult{}, classify("send: commit", err)
	}

	res := store.SendResult{ID: p.ID, Deliveries: make([]store.Delivery, 0, len(to))}
	for _, r := range locked {
		res.Deliveries = append(res.Deliveries, store.Delivery{Device: r.name, Seq: seqs[r.name], Push: r.push})
	}
	return res, nil
}

// readClaimAndLock reads the batch's results in order: begin, claim, lock.
func readClaimAndLock(br pgx.BatchResults) (ref int64, claimed bool, locked []recipient, err error) {
	if _, err := br.Exec(); err != nil {
		return 0, false, nil, err
	}
	switch err := br.QueryRow().Scan(&ref); {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return 0, false, nil, err
	default:
		claimed = true
	}
	rows, err := br.Query()
	if err != nil {
		return 0, false, nil, err
	}
	locked, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (recipient, error) {
		var r recipient
		err := row.Scan(&r.name, &r.head, &r.pendingCount, &r.pendingBytes, &r.push.Kind, &r.push.Address)
		return r, err
	})
	return ref, claimed, locked, err
}

// check refuses a send that names an unknown device or would overflow a
// recipient's queue. It runs with the rows locked, so what it saw still
// holds at commit. locked and to are both in name order.
func check(p store.SendParams, to []string, locked []recipient) error {
	for i, name := range to {
		if i >= len(locked) || locked[i].name != name {
			return fmt.Errorf("postgres: send: %w", &store.UnknownDeviceError{Device: name})
		}
	}
	size := int64(len(p.Payload))
	for _, r := range locked {
		if p.MaxPendingEnvelopes > 0 && r.pendingCount+1 > p.MaxPendingEnvelopes ||
			p.MaxPendingBytes > 0 && r.pendingBytes+size > p.MaxPendingBytes {
			return fmt.Errorf("postgres: send: %w", &store.QueueFullError{Device: r.name})
		}
	}
	return nil
}

// repeat answers a send whose key another send claimed first: the same
// answer again if it is the same send, ErrConflict otherwise.
func (db *DB) repeat(ctx context.Context, tx pgx.Tx, p store.SendParams, dig []byte) (store.SendResult, error) {
	var (
		stored     []byte
		deliveries []storedDelivery
	)
	err := tx.QueryRow(ctx, sqlStored, p.Household, p.Sender, p.ID).Scan(&stored, &deliveries)
	if errors.Is(err, pgx.ErrNoRows) {
		// Expiry deleted the record between our claim and this read; a
		// retry claims the id afresh.
		return store.SendResult{}, fmt.Errorf("postgres: send %q: record expired meanwhile: %w", p.ID, store.ErrUnavailable)
	}
	if err != nil {
		return store.SendResult{}, classify("send: read stored", err)
	}
	if string(stored) != string(dig) {
		return store.SendResult{}, fmt.Errorf("postgres: send %q: %w", p.ID, store.ErrConflict)
	}
	res := store.SendResult{ID: p.ID, Repeat: true, Deliveries: make([]store.Delivery, 0, len(deliveries))}
	for _, d := range deliveries {
		res.Deliveries = append(res.Deliveries, store.Delivery{Device: d.Device, Seq: d.Seq})
	}
	slices.SortFunc(res.Deliveries, func(a, b store.Delivery) int { return strings.Compare(a.Device, b.Device) })
	return res, nil
}
