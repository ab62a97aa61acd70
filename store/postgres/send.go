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

// sqlTouchSend rewrites a send's record as it is. A repeat writes nothing
// otherwise, and a commit that wrote nothing waits for no standby.
const sqlTouchSend = `
UPDATE sends SET created_at = created_at
WHERE household = $1 AND sender = $2 AND send_id = $3`

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
	if err := db.durable(ctx, p, res.Repeat); err != nil {
		return store.SendResult{}, err
	}
	return res, nil
}

// durable makes sure that a send's success means what its 202 promises:
// that the send survives the loss of this server, when it replicates
// synchronously. Besides confirmed's case, a repeat finds the record of a
// first attempt that may have been committed without a standby's word,
// and writes nothing, so its commit waits for nothing. Rewriting the
// record makes it wait, and this commit comes after the first in the WAL,
// so a standby that has this one has both.
//
// A primary cut off from its standby (a network split, a standby stopped)
// so answers 503 to every send, first or repeat, instead of 202 for sends
// that the promoted standby will not have.
func (db *DB) durable(ctx context.Context, p store.SendParams, repeat bool) error {
	if repeat {
		if _, err := db.pool.Exec(ctx, sqlTouchSend, p.Household, p.Sender, p.ID); err != nil {
			return classify("send: touch the repeated record", err)
		}
	}
	return db.confirmed(ctx, "send")
}

// confirmed is the last check of a write whose success the caller passes
// on as lasting (a send, a registration, a removal, a pairing). A commit
// whose wait for a synchronous standby is cancelled (here: ctx ended, and
// the driver sent a cancel request) is kept by Postgres and answered as
// committed, with a warning. So a call that ends after ctx did is
// unavailable, whatever it answered: the standby may lack it. The client's
// retry finds out. A deadline passed on a synchronous server also stalls
// reads until History confirms again (timeline.go).
func (db *DB) confirmed(ctx context.Context, op string) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) && db.synchronous.Load() {
		db.stalled.Store(true)
	}
	return classify(op+": the deadline passed before the commit was confirmed", err)
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
