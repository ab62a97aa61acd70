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

const deviceColumns = `household, name, cursor, head, identity_key, push_kind, push_address, registered_at, last_seen`

func scanDevice(sc interface{ Scan(...any) error }) (store.Device, error) {
	var d store.Device
	var registered, seen int64
	if err := sc.Scan(&d.Household, &d.Name, &d.Cursor, &d.Head, &d.IdentityKey,
		&d.Push.Kind, &d.Push.Address, &registered, &seen); err != nil {
		return store.Device{}, err
	}
	d.RegisteredAt = fromMicros(registered)
	d.LastSeen = fromMicros(seen)
	return d, nil
}

// Register creates the device or updates the fields p sets, in one upsert.
func (db *DB) Register(ctx context.Context, p store.RegisterParams) (store.Device, error) {
	var d store.Device
	err := db.write(ctx, "register", func(tx *sql.Tx) error {
		var err error
		if d, err = register(ctx, tx, p); err != nil {
			return err
		}
		d.Epoch, err = epochOf(ctx, tx)
		return err
	})
	if err != nil {
		return store.Device{}, err
	}
	return d, nil
}

// register is Register's upsert, on the writer's transaction tx.
func register(ctx context.Context, tx *sql.Tx, p store.RegisterParams) (store.Device, error) {
	var key any // NULL keeps the stored key
	if len(p.IdentityKey) > 0 {
		key = p.IdentityKey
	}
	setPush := p.Push != nil
	var push device.PushTarget
	if setPush {
		push = *p.Push
	}
	now := micros(p.Now)
	// The removal check and the write are one statement, under the
	// single writer: a credential older than the last removal neither
	// creates the device again nor changes the one registered since.
	d, err := scanDevice(tx.QueryRowContext(ctx, `INSERT INTO devices
		(household, name, identity_key, push_kind, push_address, registered_at, last_seen)
		SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?6 WHERE `+admitted("?8")+`
		ON CONFLICT (household, name) DO UPDATE SET
			identity_key = coalesce(excluded.identity_key, identity_key),
			push_kind    = CASE WHEN ?7 THEN excluded.push_kind ELSE push_kind END,
			push_address = CASE WHEN ?7 THEN excluded.push_address ELSE push_address END,
			last_seen    = max(last_seen, excluded.last_seen)
		WHERE `+admitted("?8")+`
		RETURNING `+deviceColumns,
		p.Household, p.Device, key, push.Kind, push.Address, now, setPush, issued(p.IssuedAt)))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Device{}, fmt.Errorf("sqlite: register %q: %w", p.Device, store.ErrRemoved)
	}
	return d, err
}

// admitted is true when the credential issued at the parameter issued (see
// the function issued) was issued after the last removal of household ?1's
// device ?2. (Parameters are numbered, not named: SQLite numbers a named
// one by where it first appears, which may be where ?1 is.)
func admitted(issued string) string {
	return `(` + issued + ` IS NULL OR NOT EXISTS (SELECT 1 FROM removals
	WHERE household = ?1 AND device = ?2 AND removed_at >= ` + issued + `))`
}

// issued is the argument admitted reads: a credential's issue time in
// micros, or NULL when there is no credential to check.
func issued(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return micros(t)
}

// Devices lists a household's devices by name, after p.After. A limit of
// zero or less lists them all.
func (db *DB) Devices(ctx context.Context, p store.ListParams) ([]store.Device, error) {
	limit := int64(-1)
	if p.Limit > 0 {
		limit = int64(p.Limit)
	}
	rows, err := db.reader.QueryContext(ctx, `SELECT `+deviceColumns+` FROM devices
		WHERE household = ? AND name > ? ORDER BY name LIMIT ?`, p.Household, p.After, limit)
	if err != nil {
		return nil, wrap(ctx, "devices", err)
	}
	defer rows.Close()
	var ds []store.Device
	for rows.Next() {
		d, err := scanDevice(rows)
		if err != nil {
			return nil, wrap(ctx, "devices", err)
		}
		ds = append(ds, d)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(ctx, "devices", err)
	}
	return ds, nil
}

// DeleteDevice removes the device row and its envelopes and records when.
// A device registered again later starts from cursor and head 0.
func (db *DB) DeleteDevice(ctx context.Context, household, device string, at time.Time) error {
	return db.write(ctx, "delete device", func(tx *sql.Tx) error {
		_, err := removeDevice(ctx, tx, household, device, at, nil)
		return err
	})
}

// RemovedAt reports the device's last removal; zero if it never was.
func (db *DB) RemovedAt(ctx context.Context, household, name string) (time.Time, error) {
	l, err := life(ctx, db.reader, household, name)
	if err != nil {
		return time.Time{}, wrap(ctx, "removed at", err)
	}
	return l.RemovedAt(), nil
}

// Removals lists up to limit devices' last removals.
func (db *DB) Removals(ctx context.Context, limit int) ([]store.Removal, error) {
	rows, err := db.reader.QueryContext(ctx, `SELECT household, device, removed_at FROM removals LIMIT ?`, limit)
	if err != nil {
		return nil, wrap(ctx, "removals", err)
	}
	defer rows.Close()
	var out []store.Removal
	for rows.Next() {
		var (
			r  store.Removal
			at int64
		)
		if err := rows.Scan(&r.Household, &r.Device, &at); err != nil {
			return nil, wrap(ctx, "removals", err)
		}
		r.At = fromMicros(at)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(ctx, "removals", err)
	}
	return out, nil
}

// ClearPush clears the push target only if it is still target, so that a
// provider's late "gone" cannot erase a target registered since.
func (db *DB) ClearPush(ctx context.Context, household, device string, target device.PushTarget) error {
	return db.write(ctx, "clear push", func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE devices SET push_kind = '', push_address = ''
			WHERE household = ? AND name = ? AND push_kind = ? AND push_address = ?`,
			household, device, target.Kind, target.Address)
		return err
	})
}

// ReportHealth records r and returns the reports made since the time given.
func (db *DB) ReportHealth(ctx context.Context, r store.RelayHealth, since time.Time) ([]store.RelayHealth, error) {
	err := db.write(ctx, "report health", func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO relays (id, wakes_ok, at) VALUES (?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET wakes_ok = excluded.wakes_ok, at = excluded.at`, r.ID, r.WakesOK, micros(r.At))
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM relays WHERE at < ?`, micros(r.At.Add(-24*time.Hour)))
		return err
	})
	if err != nil {
		return nil, err
	}
	rows, err := db.reader.QueryContext(ctx, `SELECT id, wakes_ok, at FROM relays WHERE at >= ? ORDER BY id`, micros(since))
	if err != nil {
		return nil, wrap(ctx, "report health", err)
	}
	defer rows.Close()
	var out []store.RelayHealth
	for rows.Next() {
		var h store.RelayHealth
		var at int64
		if err := rows.Scan(&h.ID, &h.WakesOK, &at); err != nil {
			return nil, wrap(ctx, "report health", err)
		}
		h.At = fromMicros(at)
		out = append(out, h)
	}
	return out, wrap(ctx, "report health", rows.Err())
}
