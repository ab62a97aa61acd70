package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flamenet/relay/store"
)

// Pairing's writes take the device's name lock (sqlLockName) before they
// read what they decide on, as a removal does: a pairing, a renewal and a
// removal of one device run one after the other, and each reads, in
// statements after the lock, what the one before committed. Under READ
// COMMITTED a row lock alone would not do: revoking a device's secrets
// could miss the successor a renewal in flight inserts.

const (
	// sqlForgetInvitations deletes a removed device's invitations and the
	// unredeemed ones it made, but for $3's (the pairing that replaces it).
	sqlForgetInvitations = `DELETE FROM invitations WHERE household = $1 AND
    (device = $2 OR (created_by = $2 AND redeemed_at IS NULL)) AND code_hash IS DISTINCT FROM $3::bytea`
	sqlForgetSecrets = `DELETE FROM renewal_secrets WHERE household = $1 AND device = $2`
)

// CreateInvitation stores p, replacing the device's unredeemed invitation,
// and drops the household's invitations nobody may list any more.
func (db *DB) CreateInvitation(ctx context.Context, p store.InviteParams) error {
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return classify("create invitation", err)
	}
	defer rollback(ctx, tx)
	// Under the name lock: a pairing that registers the name runs before
	// or after, never between the check and the insert.
	if _, err := tx.Exec(ctx, sqlLockName, p.Household, p.Device); err != nil {
		return classify("create invitation: lock", err)
	}
	if !p.Replace {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM devices WHERE household = $1 AND name = $2)`,
			p.Household, p.Device).Scan(&exists); err != nil {
			return classify("create invitation", err)
		}
		if exists {
			return fmt.Errorf("postgres: invite %q: %w", p.Device, store.ErrDeviceExists)
		}
	}
	b := &pgx.Batch{}
	b.Queue(`DELETE FROM invitations WHERE household = $1 AND
    ((device = $2 AND redeemed_at IS NULL) OR expires_at < $3)`, p.Household, p.Device, micro(p.Now.Add(-store.InvitationsKept)))
	b.Queue(`INSERT INTO invitations (code_hash, household, device, scope, created_at, expires_at, replaces, created_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, p.Code[:], p.Household, p.Device, p.Scope, micro(p.Now), micro(p.Expires),
		p.Replace, nullString(p.CreatedBy))
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return classify("create invitation", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return classify("create invitation: commit", err)
	}
	return db.confirmed(ctx, "create invitation")
}

// CancelInvitation deletes the device's unredeemed invitation.
func (db *DB) CancelInvitation(ctx context.Context, household, device string) error {
	tag, err := db.pool.Exec(ctx, `DELETE FROM invitations WHERE household = $1 AND device = $2 AND redeemed_at IS NULL`,
		household, device)
	if err != nil {
		return classify("cancel invitation", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("postgres: cancel invitation %q: %w", device, store.ErrNotFound)
	}
	return db.confirmed(ctx, "cancel invitation")
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Invitations lists the household's pending and recently redeemed
// invitations, by device.
func (db *DB) Invitations(ctx context.Context, p store.InvitationsParams) ([]store.Invitation, error) {
	rows, err := db.pool.Query(ctx, `
SELECT household, device, scope, created_at, expires_at, redeemed_at, identity_key, replaces, coalesce(created_by, '')
FROM invitations WHERE household = $1 AND
    ((redeemed_at IS NULL AND expires_at > $2) OR redeemed_at >= $3)
ORDER BY device, created_at`, p.Household, micro(p.Now), micro(p.RedeemedSince))
	if err != nil {
		return nil, classify("invitations", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Invitation, error) {
		var (
			in       store.Invitation
			redeemed *time.Time
		)
		err := row.Scan(&in.Household, &in.Device, &in.Scope, &in.CreatedAt, &in.ExpiresAt, &redeemed, &in.IdentityKey,
			&in.Replace, &in.CreatedBy)
		in.CreatedAt, in.ExpiresAt = in.CreatedAt.UTC(), in.ExpiresAt.UTC()
		if redeemed != nil {
			in.RedeemedAt = redeemed.UTC()
		}
		return in, err
	})
	if err != nil {
		return nil, classify("invitations", err)
	}
	return out, nil
}

// lockOwner reads the household and device a pairing row belongs to and
// takes that device's name lock. found is false when there is no row.
func lockOwner(ctx context.Context, tx pgx.Tx, query string, hash store.SecretHash) (found bool, err error) {
	var household, device string
	err = tx.QueryRow(ctx, query, hash[:]).Scan(&household, &device)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, err = tx.Exec(ctx, sqlLockName, household, device)
	return err == nil, err
}

// Pair redeems an invitation in one transaction.
func (db *DB) Pair(ctx context.Context, p store.PairParams) (store.Grant, error) {
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return store.Grant{}, classify("pair", err)
	}
	defer rollback(ctx, tx)
	g, err := pair(ctx, tx, p)
	if err != nil {
		return store.Grant{}, classify("pair", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return store.Grant{}, classify("pair: commit", err)
	}
	return g, db.confirmed(ctx, "pair")
}

func pair(ctx context.Context, tx pgx.Tx, p store.PairParams) (store.Grant, error) {
	found, err := lockOwner(ctx, tx, `SELECT household, device FROM invitations WHERE code_hash = $1`, p.Code)
	if err != nil {
		return store.Grant{}, err
	}
	if !found {
		return store.Grant{}, store.Refused(store.RefusedUnknown)
	}
	var (
		g                store.Grant
		created, expires time.Time
		redeemed, remove *time.Time
		taken            bool
	)
	err = tx.QueryRow(ctx, `SELECT i.household, i.device, i.scope, i.created_at, i.expires_at, i.redeemed_at, i.replaces,
    EXISTS (SELECT 1 FROM devices d WHERE d.household = i.household AND d.name = i.device),
    (SELECT removed_at FROM removals r WHERE r.household = i.household AND r.device = i.device)
FROM invitations i WHERE code_hash = $1 FOR UPDATE OF i`, p.Code[:]).
		Scan(&g.Household, &g.Device, &g.Scope, &created, &expires, &redeemed, &g.Replaced, &taken, &remove)
	switch {
	case errors.Is(err, pgx.ErrNoRows): // replaced or forgotten while we waited for the lock
		return store.Grant{}, store.Refused(store.RefusedUnknown)
	case err != nil:
		return store.Grant{}, err
	case p.Scope != "" && g.Scope != p.Scope:
		return store.Grant{}, store.Refused(store.RefusedScope)
	case redeemed != nil:
		return store.Grant{}, store.Refused(store.RefusedUsed)
	case !micro(p.Now).Before(expires):
		return store.Grant{}, store.Refused(store.RefusedExpired)
	case remove != nil && !remove.Before(created):
		// An invitation made at or before the device's last removal
		// belongs to an earlier life and brings nothing back.
		return store.Grant{}, store.Refused(store.RefusedRemoved)
	case taken && !g.Replaced:
		return store.Grant{}, store.Refused(store.RefusedTaken)
	}
	issuedAt := created
	if remove != nil {
		g.RemovedAt = remove.UTC()
	}
	if g.Replaced = taken; taken {
		// A removal, then a new life: the old device's credentials,
		// envelopes and key go, and the new one registers after it.
		if g.RemovedAt, err = removeDevice(ctx, tx, g.Household, g.Device, p.Now, p.Code[:]); err != nil {
			return store.Grant{}, err
		}
		issuedAt = g.RemovedAt.Add(time.Microsecond)
	}
	var key any
	if len(p.IdentityKey) > 0 {
		key = p.IdentityKey
	}
	rows, err := tx.Query(ctx, sqlRegister, g.Household, g.Device, key, nil, nil, micro(p.Now), issued(issuedAt))
	if err != nil {
		return store.Grant{}, err
	}
	ds, err := pgx.CollectRows(rows, scanDevice)
	if err != nil {
		return store.Grant{}, err
	}
	if len(ds) == 0 {
		return store.Grant{}, store.Refused(store.RefusedRemoved)
	}
	if _, err := tx.Exec(ctx, `UPDATE invitations SET redeemed_at = $2, identity_key = $3 WHERE code_hash = $1`,
		p.Code[:], micro(p.Now), key); err != nil {
		return store.Grant{}, err
	}
	// A pairing starts the device's family of secrets anew.
	if _, err := tx.Exec(ctx, sqlForgetSecrets, g.Household, g.Device); err != nil {
		return store.Grant{}, err
	}
	return g, insertSecret(ctx, tx, g, p.Secret, p.Now, store.IssuedAfter(p.Now, g.RemovedAt), p.SecretExpires)
}

// insertSecret stores secret, issued at issuedAt.
func insertSecret(ctx context.Context, tx pgx.Tx, g store.Grant, secret store.SecretHash, now, issuedAt, expires time.Time) error {
	// The device's expired secrets go on the way: an expired secret is
	// refused as expired or unknown alike.
	if _, err := tx.Exec(ctx, `DELETE FROM renewal_secrets WHERE household = $1 AND device = $2 AND expires_at <= $3`,
		g.Household, g.Device, micro(now)); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO renewal_secrets (secret_hash, household, device, scope, issued_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6)`, secret[:], g.Household, g.Device, g.Scope, micro(issuedAt), micro(expires))
	return err
}

// Renew rotates a renewal secret in one transaction, under the device's
// name lock: two renewals of one secret run one after the other, and the
// second sees the first's use.
func (db *DB) Renew(ctx context.Context, p store.RenewParams) (store.Grant, error) {
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return store.Grant{}, classify("renew", err)
	}
	defer rollback(ctx, tx)
	g, refusal, err := renew(ctx, tx, p)
	if err != nil {
		return store.Grant{}, classify("renew", err)
	}
	// Committed even when refused: reuse revokes before it refuses.
	if err := tx.Commit(ctx); err != nil {
		return store.Grant{}, classify("renew: commit", err)
	}
	if err := db.confirmed(ctx, "renew"); err != nil {
		return store.Grant{}, err
	}
	if refusal != nil {
		return store.Grant{}, refusal
	}
	return g, nil
}

func renew(ctx context.Context, tx pgx.Tx, p store.RenewParams) (g store.Grant, refusal, err error) {
	found, err := lockOwner(ctx, tx, `SELECT household, device FROM renewal_secrets WHERE secret_hash = $1`, p.Secret)
	if err != nil {
		return store.Grant{}, nil, err
	}
	if !found {
		return store.Grant{}, store.Refused(store.RefusedUnknown), nil
	}
	var (
		issuedAt, expires               time.Time
		used, revoked, retried, removed *time.Time
		successor                       []byte
	)
	err = tx.QueryRow(ctx, `
SELECT s.household, s.device, s.scope, s.issued_at, s.expires_at, s.used_at, s.successor, s.revoked_at, s.retried_at,
    (SELECT removed_at FROM removals r WHERE r.household = s.household AND r.device = s.device)
FROM renewal_secrets s WHERE secret_hash = $1`, p.Secret[:]).
		Scan(&g.Household, &g.Device, &g.Scope, &issuedAt, &expires, &used, &successor, &revoked, &retried, &removed)
	now := micro(p.Now)
	switch {
	case errors.Is(err, pgx.ErrNoRows): // forgotten by a removal while we waited for the lock
		return store.Grant{}, store.Refused(store.RefusedUnknown), nil
	case err != nil:
		return store.Grant{}, nil, err
	case removed != nil && !removed.Before(issuedAt):
		return store.Grant{}, store.Refused(store.RefusedRemoved), nil
	case !now.Before(expires):
		return store.Grant{}, store.Refused(store.RefusedExpired), nil
	case revoked != nil:
		// Whoever presents it, the family it belongs to is no longer
		// trusted: the holder of its live secret may be a thief.
		return store.Grant{}, store.Refused(store.RefusedRevoked), revokeFamily(ctx, tx, g, now)
	}
	if removed != nil {
		g.RemovedAt = removed.UTC()
	}
	if used != nil {
		retry := false
		if retried == nil && now.Sub(*used) < p.Grace && successor != nil {
			var sUsed, sRevoked *time.Time
			err := tx.QueryRow(ctx, `SELECT used_at, revoked_at FROM renewal_secrets WHERE secret_hash = $1`, successor).Scan(&sUsed, &sRevoked)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return store.Grant{}, nil, err
			}
			retry = err == nil && sUsed == nil && sRevoked == nil
		}
		if !retry {
			return store.Grant{}, store.Refused(store.RefusedReused), revokeFamily(ctx, tx, g, now)
		}
		// A client retrying a lost answer, once: what that answer
		// carried is revoked and replaced.
		if _, err := tx.Exec(ctx, `UPDATE renewal_secrets SET revoked_at = $2 WHERE secret_hash = $1`, successor, now); err != nil {
			return store.Grant{}, nil, err
		}
		if _, err := tx.Exec(ctx, `UPDATE renewal_secrets SET successor = $2, retried_at = $3 WHERE secret_hash = $1`,
			p.Secret[:], p.NewSecret[:], now); err != nil {
			return store.Grant{}, nil, err
		}
	} else if _, err := tx.Exec(ctx, `UPDATE renewal_secrets SET used_at = $2, successor = $3 WHERE secret_hash = $1`,
		p.Secret[:], now, p.NewSecret[:]); err != nil {
		return store.Grant{}, nil, err
	}
	return g, nil, insertSecret(ctx, tx, g, p.NewSecret, p.Now, store.IssuedAfter(p.Now, g.RemovedAt), p.SecretExpires)
}

// revokeFamily revokes every renewal secret of g's device.
func revokeFamily(ctx context.Context, tx pgx.Tx, g store.Grant, now time.Time) error {
	_, err := tx.Exec(ctx, `UPDATE renewal_secrets SET revoked_at = $3 WHERE household = $1 AND device = $2 AND revoked_at IS NULL`,
		g.Household, g.Device, now)
	return err
}
