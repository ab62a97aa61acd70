package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/flamenet/relay/store"
)

// storedDelivery is one entry of a send's stored answer.
type storedDelivery struct {
	Device string `json:"d"`
	Seq    int64  `json:"s"`
}

// Send stores one envelope per recipient in one transaction, or nothing.
func (db *DB) Send(ctx context.Context, p store.SendParams) (store.SendResult, error) {
	// The contract hands To sorted and unique; normalising again costs
	// little and keeps the lock order whatever the caller did.
	to := store.Recipients(p.To)
	if len(to) == 0 {
		return store.SendResult{}, errors.New("sqlite: send: no recipients")
	}
	digest := store.Digest(to, p.Payload)
	size := int64(len(p.Payload))
	now := micros(p.Now)

	var res store.SendResult
	err := db.write(ctx, "send", func(tx *sql.Tx) error {
		res = store.SendResult{ID: p.ID}

		var stored []byte
		var answer string
		err := tx.QueryRowContext(ctx, `SELECT digest, deliveries FROM sends
			WHERE household = ? AND sender = ? AND send_id = ?`,
			p.Household, p.Sender, p.ID).Scan(&stored, &answer)
		switch {
		case err == nil:
			if string(stored) != string(digest[:]) {
				return fmt.Errorf("send %q: %w", p.ID, store.ErrConflict)
			}
			var ds []storedDelivery
			if err := json.Unmarshal([]byte(answer), &ds); err != nil {
				return fmt.Errorf("send %q: stored answer: %w", p.ID, err)
			}
			for _, d := range ds {
				res.Deliveries = append(res.Deliveries, store.Delivery{Device: d.Device, Seq: d.Seq})
			}
			res.Repeat = true
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}

		type recipient struct {
			head, count, bytes int64
			push               store.PushTarget
			found              bool
		}
		rs := make([]recipient, len(to))
		for i, dev := range to {
			r := &rs[i]
			err := tx.QueryRowContext(ctx, `SELECT head, pending_count, pending_bytes, push_kind, push_address
				FROM devices WHERE household = ? AND name = ?`, p.Household, dev).
				Scan(&r.head, &r.count, &r.bytes, &r.push.Kind, &r.push.Address)
			switch {
			case err == nil:
				r.found = true
			case !errors.Is(err, sql.ErrNoRows):
				return err
			}
		}
		// Unknown recipients are reported before full queues: the first is
		// a mistake of the sender, the second a state of the recipient.
		for i, r := range rs {
			if !r.found {
				return &store.UnknownDeviceError{Device: to[i]}
			}
		}
		for i, r := range rs {
			if (p.MaxPendingEnvelopes > 0 && r.count+1 > p.MaxPendingEnvelopes) ||
				(p.MaxPendingBytes > 0 && r.bytes+size > p.MaxPendingBytes) {
				return &store.QueueFullError{Device: to[i]}
			}
		}

		ds := make([]storedDelivery, len(to))
		for i, dev := range to {
			ds[i] = storedDelivery{Device: dev, Seq: rs[i].head + 1}
		}
		answerJSON, err := json.Marshal(ds)
		if err != nil {
			return err
		}
		ins, err := tx.ExecContext(ctx, `INSERT INTO sends (household, sender, send_id, digest, deliveries, created_at)
			VALUES (?, ?, ?, ?, ?, ?)`, p.Household, p.Sender, p.ID, digest[:], string(answerJSON), now)
		if err != nil {
			return err
		}
		ref, err := ins.LastInsertId()
		if err != nil {
			return err
		}
		for i, dev := range to {
			// The seq is the device's head + 1, read and written inside this
			// transaction, which holds the database's only write lock:
			// consecutive per device, in commit order, and a rollback gives
			// nothing away.
			seq := ds[i].Seq
			if _, err := tx.ExecContext(ctx, `UPDATE devices
				SET head = ?, pending_count = pending_count + 1, pending_bytes = pending_bytes + ?
				WHERE household = ? AND name = ?`, seq, size, p.Household, dev); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO envelopes
				(household, device, seq, send_ref, sender, send_id, sent_at, size, payload)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				p.Household, dev, seq, ref, p.Sender, p.ID, now, size, nonNil(p.Payload)); err != nil {
				return err
			}
			res.Deliveries = append(res.Deliveries, store.Delivery{Device: dev, Seq: seq, Push: rs[i].push})
		}
		return nil
	})
	if err != nil {
		return store.SendResult{}, err
	}
	return res, nil
}

// nonNil keeps an empty payload a zero-length BLOB rather than NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
