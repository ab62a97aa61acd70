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

const deviceColumns = `household, name, identity_key, push_kind, push_address,
    cursor, head, registered_at, last_seen`

func scanDevice(row pgx.CollectableRow) (store.Device, error) {
	var d store.Device
	err := row.Scan(&d.Household, &d.Name, &d.IdentityKey, &d.Push.Kind, &d.Push.Address,
		&d.Cursor, &d.Head, &d.RegisteredAt, &d.LastSeen)
	d.RegisteredAt = d.RegisteredAt.UTC()
	d.LastSeen = d.LastSeen.UTC()
	return d, err
}

// sqlLockName serialises the writes that decide whether a device name is
// in use: a removal, and a creation or registration checked against it
// (sqlAdmitted). Taken in a statement of its own, so that the statement
// after it reads a snapshot taken once a removal that held it committed.
// The two-key form does not share its key space with migrateLockKey.
const sqlLockName = `SELECT pg_advisory_xact_lock(1919250021, hashtext($1 || '/' || $2))`

// sqlAdmitted is true when the credential issued at the parameter issued
// (see the function issued; NULL: no credential to check) was issued after
// the last removal of household $1's device $2.
func sqlAdmitted(issued string) string {
	return `(` + issued + `::timestamptz IS NULL OR NOT EXISTS (SELECT 1 FROM removals
    WHERE household = $1 AND device = $2 AND removed_at >= ` + issued + `))`
}

// sqlRegister creates the device or updates only what the call names: a
// NULL argument keeps the stored value. The removal check and the write
// are one statement: a credential older than the last removal neither
// creates the device again nor changes the one registered since.
var sqlRegister = `
INSERT INTO devices AS d (household, name, identity_key, push_kind, push_address, registered_at, last_seen)
SELECT $1, $2, $3::bytea, coalesce($4::text, ''), coalesce($5::text, ''), $6::timestamptz, $6::timestamptz
WHERE ` + sqlAdmitted("$7") + `
ON CONFLICT (household, name) DO UPDATE SET
    identity_key = coalesce($3, d.identity_key),
    push_kind    = coalesce($4, d.push_kind),
    push_address = coalesce($5, d.push_address),
    last_seen    = GREATEST(d.last_seen, $6)
WHERE ` + sqlAdmitted("$7") + `
RETURNING ` + deviceColumns

// Register creates the device or updates its push target and identity key.
func (db *DB) Register(ctx context.Context, p store.RegisterParams) (store.Device, error) {
	var key, kind, addr any // nil: keep the stored value
	if len(p.IdentityKey) > 0 {
		key = p.IdentityKey
	}
	if p.Push != nil {
		kind, addr = p.Push.Kind, p.Push.Address
	}
	var (
		d     store.Device
		found bool
	)
	b := &pgx.Batch{}
	b.Queue(sqlLockName, p.Household, p.Device)
	b.Queue(sqlRegister, p.Household, p.Device, key, kind, addr, micro(p.Now), issued(p.IssuedAt)).Query(func(rows pgx.Rows) error {
		ds, err := pgx.CollectRows(rows, scanDevice)
		if len(ds) == 1 {
			d, found = ds[0], true
		}
		return err
	})
	// In the same implicit transaction as the registration.
	var epoch *string
	b.Queue(sqlEpoch).QueryRow(func(row pgx.Row) error { return row.Scan(&epoch) })
	// A batch without BEGIN runs as one implicit transaction: the lock is
	// held until the registration commits.
	if err := db.pool.SendBatch(ctx, b).Close(); err != nil {
		return store.Device{}, classify("register", err)
	}
	if err := db.confirmed(ctx, "register"); err != nil {
		return store.Device{}, err
	}
	if !found {
		return store.Device{}, fmt.Errorf("postgres: register %q: %w", p.Device, store.ErrRemoved)
	}
	d.Epoch = str(epoch)
	return d, nil
}

// issued is a credential's issue time as sqlAdmitted reads it: NULL when
// there is no credential to check.
func issued(t time.Time) pgtype.Timestamptz {
	if t.IsZero() {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: micro(t), Valid: true}
}

const sqlDevices = `
SELECT ` + deviceColumns + ` FROM devices
WHERE household = $1 AND name > $2
ORDER BY name
LIMIT $3`

// Devices lists a household's devices by name, after p.After.
func (db *DB) Devices(ctx context.Context, p store.ListParams) ([]store.Device, error) {
	var limit any // NULL: no limit
	if p.Limit > 0 {
		limit = p.Limit
	}
	rows, err := db.pool.Query(ctx, sqlDevices, p.Household, p.After, limit)
	if err != nil {
		return nil, classify("devices", err)
	}
	ds, err := pgx.CollectRows(rows, scanDevice)
	if err != nil {
		return nil, classify("devices", err)
	}
	return ds, nil
}

const (
	// sqlDeleteDevice takes the device's row first: a send that locked it
	// commits before, and a later send finds no device.
	sqlDeleteDevice = `DELETE FROM devices WHERE household = $1 AND name = $2`
	// sqlDeleteDeviceEnvelopes runs after sqlDeleteDevice, as a statement
	// of its own, so that it sees the envelopes of a send that committed
	// while the delete waited for the row.
	sqlDeleteDeviceEnvelopes = `DELETE FROM envelopes WHERE household = $1 AND device = $2`
	sqlRecordRemoval         = `
INSERT INTO removals AS r (household, device, removed_at) VALUES ($1, $2, $3)
ON CONFLICT (household, device) DO UPDATE SET removed_at = GREATEST(r.removed_at, $3)
RETURNING removed_at`
)

// removeDevice is DeleteDevice's work on tx, under the device's name lock
// (forget's keep included); it returns the removal as recorded.
func removeDevice(ctx context.Context, tx pgx.Tx, household, device string, at time.Time, keep []byte) (time.Time, error) {
	tag, err := tx.Exec(ctx, sqlDeleteDevice, household, device)
	if err != nil {
		return time.Time{}, err
	}
	if tag.RowsAffected() == 0 {
		return time.Time{}, fmt.Errorf("postgres: delete device %q: %w", device, store.ErrNotFound)
	}
	b := &pgx.Batch{}
	b.Queue(sqlDeleteDeviceEnvelopes, household, device)
	b.Queue(sqlForgetInvitations, household, device, keep)
	b.Queue(sqlForgetSecrets, household, device)
	var removed time.Time
	b.Queue(sqlRecordRemoval, household, device, micro(at)).QueryRow(func(row pgx.Row) error { return row.Scan(&removed) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return time.Time{}, err
	}
	return removed.UTC(), nil
}

// DeleteDevice removes a device with its envelopes and records when.
func (db *DB) DeleteDevice(ctx context.Context, household, device string, at time.Time) error {
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return classify("delete device", err)
	}
	defer rollback(ctx, tx)
	if _, err := tx.Exec(ctx, sqlLockName, household, device); err != nil {
		return classify("delete device: lock", err)
	}
	if _, err := removeDevice(ctx, tx, household, device, at, nil); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return err
		}
		return classify("delete device", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return classify("delete device: commit", err)
	}
	return db.confirmed(ctx, "delete device")
}

// RemovedAt reports the device's last removal, or the zero time.
func (db *DB) RemovedAt(ctx context.Context, household, device string) (time.Time, error) {
	var at time.Time
	err := db.pool.QueryRow(ctx,
		`SELECT removed_at FROM removals WHERE household = $1 AND device = $2`,
		household, device).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, classify("removed at", err)
	}
	return at.UTC(), nil
}

// Removals lists up to limit devices' last removals.
func (db *DB) Removals(ctx context.Context, limit int) ([]store.Removal, error) {
	rows, err := db.pool.Query(ctx, `SELECT household, device, removed_at FROM removals LIMIT $1`, limit)
	if err != nil {
		return nil, classify("removals", err)
	}
	var out []store.Removal
	for rows.Next() {
		var r store.Removal
		if err := rows.Scan(&r.Household, &r.Device, &r.At); err != nil {
			rows.Close()
			return nil, classify("removals", err)
		}
		r.At = r.At.UTC()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, classify("removals", err)
	}
	return out, nil
}

// ClearPush clears the push target if it is still target, so that a
// provider's late "gone" cannot wipe a target registered since.
func (db *DB) ClearPush(ctx context.Context, household, device string, target device.PushTarget) error {
	_, err := db.pool.Exec(ctx, `
UPDATE devices SET push_kind = '', push_address = ''
WHERE household = $1 AND name = $2 AND push_kind = $3 AND push_address = $4`,
		household, device, target.Kind, target.Address)
	return classify("clear push", err)
}

// sqlReportHealth records a relay's report and reads the fleet's recent
// ones in one statement. The SELECT sees the table as it was before the
// upsert (one snapshot), so the relay's own row comes from RETURNING.
// Rows of relays gone for a day are dropped on the way.
const sqlReportHealth = `
WITH up AS (
    INSERT INTO relays (id, wakes_ok, at) VALUES ($1, $2, $3)
    ON CONFLICT (id) DO UPDATE SET wakes_ok = excluded.wakes_ok, at = excluded.at
    RETURNING id, wakes_ok, at
), gone AS (
    DELETE FROM relays WHERE at < $3 - interval '1 day'
)
SELECT id, wakes_ok, at FROM relays WHERE at >= $4 AND id <> $1
UNION ALL
SELECT id, wakes_ok, at FROM up`

// ReportHealth records r and returns the reports made since the time given.
func (db *DB) ReportHealth(ctx context.Context, r store.RelayHealth, since time.Time) ([]store.RelayHealth, error) {
	rows, err := db.pool.Query(ctx, sqlReportHealth, r.ID, r.WakesOK, micro(r.At), micro(since))
	if err != nil {
		return nil, classify("report health", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.RelayHealth, error) {
		var h store.RelayHealth
		err := row.Scan(&h.ID, &h.WakesOK, &h.At)
		h.At = h.At.UTC()
		return h, err
	})
	if err != nil {
		return nil, classify("report health", err)
	}
	return out, nil
}
