package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

// storedDelivery is one entry of a send's stored answer.
type storedDelivery struct {
	Device string `json:"d"`
	Seq    int64  `json:"s"`
}

// Send stores one envelope per recipient, or nothing, as one job of a
// group commit (group.go).
func (db *DB) Send(ctx context.Context, p store.SendParams) (store.SendResult, error) {
	// The contract hands To sorted and unique; normalising again costs
	// little and keeps the deliveries in name order whatever the caller did.
	to := store.Recipients(p.To)
	if len(to) == 0 {
		return store.SendResult{}, errors.New("sqlite: send: no recipients")
	}
	var res store.SendResult
	j := &job{op: "send", bytes: int64(len(p.Payload) * len(to)), run: func(ctx context.Context, q querier) error {
		var err error
		res, err = send(ctx, q, p, to)
		return err
	}}
	if err := db.submit(ctx, j); err != nil {
		return store.SendResult{}, err
	}
	return res, nil
}

// send is the body of a send inside the group's transaction, which holds
// the database's only write lock: seqs are head + 1, consecutive per
// device, in commit order, and a refusal rolls back to the job's savepoint
// and gives nothing away. It claims the id first, as the first send of an
// id is the common case: one statement, and a repeat learns it from the
// claim.
func send(ctx context.Context, q querier, p store.SendParams, to []string) (store.SendResult, error) {
	digest := store.Digest(to, p.Payload)
	size := int64(len(p.Payload))
	now := micros(p.Now)
	res := store.SendResult{ID: p.ID}

	var ref int64
	err := q.QueryRowContext(ctx, `INSERT INTO sends (household, sender, send_id, digest, deliveries, created_at)
		VALUES (?, ?, ?, ?, '[]', ?)
		ON CONFLICT (household, sender, send_id) DO NOTHING
		RETURNING id`, p.Household, p.Sender, p.ID, digest[:], now).Scan(&ref)
	if errors.Is(err, sql.ErrNoRows) {
		return repeat(ctx, q, p, digest[:])
	}
	if err != nil {
		return res, err
	}

	type recipient struct {
		head, count, bytes int64
		removed            int64 // Unix microseconds of the last removal; 0: never
		push               device.PushTarget
		found              bool
	}
	rs := make([]recipient, len(to))
	for i, dev := range to {
		r := &rs[i]
		err := q.QueryRowContext(ctx, `SELECT d.head, d.pending_count, d.pending_bytes, d.push_kind, d.push_address,
				coalesce(r.removed_at, 0)
			FROM devices d LEFT JOIN removals r ON r.household = d.household AND r.device = d.name
			WHERE d.household = ? AND d.name = ?`, p.Household, dev).
			Scan(&r.head, &r.count, &r.bytes, &r.push.Kind, &r.push.Address, &r.removed)
		switch {
		case err == nil:
			r.found = true
		case !errors.Is(err, sql.ErrNoRows):
			return res, err
		}
	}
	// Unknown recipients are reported before full queues: the first is a
	// mistake of the sender, the second a state of the recipient. The
	// household's bound comes last.
	for i, r := range rs {
		if !r.found {
			return res, &store.UnknownDeviceError{Device: to[i]}
		}
	}
	for i, r := range rs {
		if (p.MaxPendingEnvelopes > 0 && r.count+1 > p.MaxPendingEnvelopes) ||
			(p.MaxPendingBytes > 0 && r.bytes+size > p.MaxPendingBytes) {
			return res, &store.QueueFullError{Device: to[i]}
		}
	}
	if p.MaxHouseholdPendingBytes > 0 {
		var total int64
		if err := q.QueryRowContext(ctx, `SELECT coalesce(sum(pending_bytes), 0) FROM devices WHERE household = ?`,
			p.Household).Scan(&total); err != nil {
			return res, err
		}
		if total+size*int64(len(to)) > p.MaxHouseholdPendingBytes {
			return res, &store.HouseholdFullError{Household: p.Household}
		}
	}

	ds := make([]storedDelivery, len(to))
	for i, dev := range to {
		ds[i] = storedDelivery{Device: dev, Seq: rs[i].head + 1}
	}
	answer, err := json.Marshal(ds)
	if err != nil {
		return res, err
	}
	if _, err := q.ExecContext(ctx, `UPDATE sends SET deliveries = ? WHERE id = ?`, string(answer), ref); err != nil {
		return res, err
	}
	for i, dev := range to {
		seq := ds[i].Seq
		if _, err := q.ExecContext(ctx, `UPDATE devices
			SET head = ?, pending_count = pending_count + 1, pending_bytes = pending_bytes + ?
			WHERE household = ? AND name = ?`, seq, size, p.Household, dev); err != nil {
			return res, err
		}
		if _, err := q.ExecContext(ctx, `INSERT INTO envelopes
			(household, device, seq, send_ref, sender, send_id, sent_at, size, payload)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			p.Household, dev, seq, ref, p.Sender, p.ID, now, size, nonNil(p.Payload)); err != nil {
			return res, err
		}
		res.Deliveries = append(res.Deliveries, store.Delivery{Device: dev, Seq: seq, Push: rs[i].push, Pending: true, Life: device.LifeAfter(removalTime(rs[i].removed))})
	}
	return res, nil
}

// repeat answers a send whose id is already stored: the stored answer if
// the content is the same (with each recipient's push target now and
// whether its copy is still stored), ErrConflict otherwise.
func repeat(ctx context.Context, q querier, p store.SendParams, digest []byte) (store.SendResult, error) {
	var (
		ref    int64
		stored []byte
		answer string
	)
	if err := q.QueryRowContext(ctx, `SELECT id, digest, deliveries FROM sends
		WHERE household = ? AND sender = ? AND send_id = ?`,
		p.Household, p.Sender, p.ID).Scan(&ref, &stored, &answer); err != nil {
		return store.SendResult{}, err
	}
	if string(stored) != string(digest) {
		return store.SendResult{}, fmt.Errorf("send %q: %w", p.ID, store.ErrConflict)
	}
	var ds []storedDelivery
	if err := json.Unmarshal([]byte(answer), &ds); err != nil {
		return store.SendResult{}, fmt.Errorf("send %q: stored answer: %w", p.ID, err)
	}
	res := store.SendResult{ID: p.ID, Repeat: true}
	for _, d := range ds {
		out := store.Delivery{Device: d.Device, Seq: d.Seq}
		// send_ref, not just the seq: a device removed and registered
		// again gives the same seqs to other sends.
		var removed int64
		err := q.QueryRowContext(ctx, `SELECT coalesce(d.push_kind, ''), coalesce(d.push_address, ''),
				EXISTS (SELECT 1 FROM envelopes e
					WHERE e.household = ?1 AND e.device = ?2 AND e.seq = ?3 AND e.send_ref = ?4),
				coalesce((SELECT removed_at FROM removals WHERE household = ?1 AND device = ?2), 0)
			FROM (SELECT 1) LEFT JOIN devices d ON d.household = ?1 AND d.name = ?2`,
			p.Household, d.Device, d.Seq, ref).Scan(&out.Push.Kind, &out.Push.Address, &out.Pending, &removed)
		if err != nil {
			return store.SendResult{}, err
		}
		out.Life = device.LifeAfter(removalTime(removed))
		res.Deliveries = append(res.Deliveries, out)
	}
	return res, nil
}

// removalTime is a stored removal time; 0 means never.
func removalTime(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return fromMicros(us)
}

// nonNil keeps an empty payload a zero-length BLOB rather than NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
