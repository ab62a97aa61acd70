package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

// sqlSend is the whole send: relay_send (migration 0002) claims the id,
// locks the recipients in name order, checks them, gives seqs, stores the
// copies and records the answer, or answers a repeat from the stored
// record. In autocommit the call is its own transaction: one round trip,
// and a refusal (a raised SQLSTATE) rolls back everything it wrote.
const sqlSend = `
SELECT to_device, to_seq, to_push_kind, to_push_address, to_pending, to_repeat, to_removed_at
FROM relay_send($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`

// SQLSTATEs relay_send raises for a refused send (migration 0002).
const (
	codeUnknownDevice = "RL001"
	codeQueueFull     = "RL002"
	codeHouseholdFull = "RL003"
	codeConflict      = "RL004"
	codeExpired       = "RL005"
)

// Send stores one envelope per recipient in one call of relay_send: one
// statement in autocommit, one round trip once the statement is prepared.
func (db *DB) Send(ctx context.Context, p store.SendParams) (store.SendResult, error) {
	// The contract hands To sorted and unique; normalising again costs
	// little and keeps the lock order whatever the caller did. relay_send
	// relies on it: it compares the locked names with To in order.
	to := store.Recipients(p.To)
	if len(to) == 0 {
		return store.SendResult{}, errors.New("postgres: send: no recipients")
	}
	sum := store.Digest(to, p.Payload)
	payload := p.Payload
	if payload == nil {
		payload = []byte{} // bytea NOT NULL: an empty payload is not NULL
	}

	rows, err := db.pool.Query(ctx, sqlSend, p.Household, p.Sender, p.ID, sum[:], to, payload, micro(p.Now),
		p.MaxPendingEnvelopes, p.MaxPendingBytes, p.MaxHouseholdPendingBytes)
	if err != nil {
		return store.SendResult{}, sendError(p, err)
	}
	res := store.SendResult{ID: p.ID, Deliveries: make([]store.Delivery, 0, len(to))}
	var (
		d       store.Delivery
		repeat  bool
		removed pgtype.Timestamptz
	)
	_, err = pgx.ForEachRow(rows, []any{&d.Device, &d.Seq, &d.Push.Kind, &d.Push.Address, &d.Pending, &repeat, &removed}, func() error {
		d.Life = device.Life{}
		if removed.Valid {
			d.Life = device.LifeAfter(removed.Time)
		}
		res.Deliveries = append(res.Deliveries, d)
		res.Repeat = repeat
		return nil
	})
	if err != nil {
		return store.SendResult{}, sendError(p, err)
	}
	return res, nil
}

// sendError turns relay_send's refusals into the store's errors and
// classifies everything else.
func sendError(p store.SendParams, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return classify("send", err)
	}
	switch pgErr.Code {
	case codeUnknownDevice:
		return fmt.Errorf("postgres: send: %w", &store.UnknownDeviceError{Device: pgErr.Detail})
	case codeQueueFull:
		return fmt.Errorf("postgres: send: %w", &store.QueueFullError{Device: pgErr.Detail})
	case codeHouseholdFull:
		return fmt.Errorf("postgres: send: %w", &store.HouseholdFullError{Household: p.Household})
	case codeConflict:
		return fmt.Errorf("postgres: send %q: %w", p.ID, store.ErrConflict)
	case codeExpired:
		// Expiry deleted the record between the claim and the read; a
		// retry claims the id afresh.
		return fmt.Errorf("postgres: send %q: record expired meanwhile: %w", p.ID, store.ErrUnavailable)
	}
	return classify("send", err)
}
