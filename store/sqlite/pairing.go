package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/flamenet/relay/store"
)

// forget deletes a removed device's invitations and renewal secrets, inside
// its removal's transaction.
func forget(ctx context.Context, tx *sql.Tx, household, device string) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM invitations WHERE household = ? AND device = ?`, household, device); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `DELETE FROM renewal_secrets WHERE household = ? AND device = ?`, household, device)
	return err
}

// CreateInvitation stores p, replacing the device's unredeemed invitation,
// and drops the household's invitations that nobody may list any more.
func (db *DB) CreateInvitation(ctx context.Context, p store.InviteParams) error {
	return db.write(ctx, "create invitation", func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM invitations WHERE household = ?1 AND
			((device = ?2 AND redeemed_at IS NULL) OR expires_at < ?3)`,
			p.Household, p.Device, micros(p.Now.Add(-store.InvitationsKept))); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO invitations (code_hash, household, device, scope, created_at, expires_at)
			VALUES (?, ?, ?, ?, ?, ?)`, p.Code[:], p.Household, p.Device, p.Scope, micros(p.Now), micros(p.Expires))
		return err
	})
}

// Invitations lists the household's pending and recently redeemed
// invitations, by device.
func (db *DB) Invitations(ctx context.Context, p store.InvitationsParams) ([]store.Invitation, error) {
	rows, err := db.reader.QueryContext(ctx, `SELECT household, device, scope, created_at, expires_at, redeemed_at, identity_key
		FROM invitations WHERE household = ?1 AND
			((redeemed_at IS NULL AND expires_at > ?2) OR redeemed_at >= ?3)
		ORDER BY device, created_at`, p.Household, micros(p.Now), micros(p.RedeemedSince))
	if err != nil {
		return nil, wrap(ctx, "invitations", err)
	}
	defer rows.Close()
	var out []store.Invitation
	for rows.Next() {
		var (
			in               store.Invitation
			created, expires int64
			redeemed         sql.NullInt64
		)
		if err := rows.Scan(&in.Household, &in.Device, &in.Scope, &created, &expires, &redeemed, &in.IdentityKey); err != nil {
			return nil, wrap(ctx, "invitations", err)
		}
		in.CreatedAt, in.ExpiresAt = fromMicros(created), fromMicros(expires)
		if redeemed.Valid {
			in.RedeemedAt = fromMicros(redeemed.Int64)
		}
		out = append(out, in)
	}
	return out, wrap(ctx, "invitations", rows.Err())
}

// Pair redeems an invitation in one transaction on the single writer.
func (db *DB) Pair(ctx context.Context, p store.PairParams) (store.Grant, error) {
	var g store.Grant
	err := db.write(ctx, "pair", func(tx *sql.Tx) error {
		var (
			created, expires int64
			redeemed         sql.NullInt64
		)
		err := tx.QueryRowContext(ctx, `SELECT household, device, scope, created_at, expires_at, redeemed_at
			FROM invitations WHERE code_hash = ?`, p.Code[:]).Scan(&g.Household, &g.Device, &g.Scope, &created, &expires, &redeemed)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return store.Refused(store.RefusedUnknown)
		case err != nil:
			return err
		case redeemed.Valid:
			return store.Refused(store.RefusedUsed)
		case micros(p.Now) >= expires:
			return store.Refused(store.RefusedExpired)
		}
		// Registered as a credential issued when the invitation was: an
		// invitation made at or before the device's last removal
		// belongs to an earlier life and brings nothing back.
		_, err = register(ctx, tx, store.RegisterParams{Household: g.Household, Device: g.Device,
			IdentityKey: p.IdentityKey, Now: p.Now, IssuedAt: fromMicros(created)})
		if errors.Is(err, store.ErrRemoved) {
			return store.Refused(store.RefusedRemoved)
		}
		if err != nil {
			return err
		}
		var key any
		if len(p.IdentityKey) > 0 {
			key = p.IdentityKey
		}
		if _, err := tx.ExecContext(ctx, `UPDATE invitations SET redeemed_at = ?, identity_key = ? WHERE code_hash = ?`,
			micros(p.Now), key, p.Code[:]); err != nil {
			return err
		}
		return insertSecret(ctx, tx, g, p.Secret, p.Now, p.SecretExpires)
	})
	if err != nil {
		return store.Grant{}, err
	}
	return g, nil
}

func insertSecret(ctx context.Context, tx *sql.Tx, g store.Grant, secret store.SecretHash, now, expires time.Time) error {
	// The device's expired secrets go on the way: reuse of an expired
	// secret is refused as expired or unknown alike.
	if _, err := tx.ExecContext(ctx, `DELETE FROM renewal_secrets WHERE household = ? AND device = ? AND expires_at <= ?`,
		g.Household, g.Device, micros(now)); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO renewal_secrets (secret_hash, household, device, scope, issued_at, expires_at)
		VALUES (?, ?, ?, ?, ?, ?)`, secret[:], g.Household, g.Device, g.Scope, micros(now), micros(expires))
	return err
}

// Renew rotates a renewal secret in one transaction on the single writer:
// two renewals of one secret run one after the other, and the second sees
// the first's use.
func (db *DB) Renew(ctx context.Context, p store.RenewParams) (store.Grant, error) {
	var (
		g       store.Grant
		refusal error // committed, then returned: reuse revokes before it refuses
	)
	now := micros(p.Now)
	err := db.write(ctx, "renew", func(tx *sql.Tx) error {
		var (
			issued, expires int64
			used, revoked   sql.NullInt64
			successor       []byte
			removed         sql.NullInt64
		)
		err := tx.QueryRowContext(ctx, `SELECT s.household, s.device, s.scope, s.issued_at, s.expires_at, s.used_at, s.successor, s.revoked_at,
				(SELECT removed_at FROM removals r WHERE r.household = s.household AND r.device = s.device)
			FROM renewal_secrets s WHERE secret_hash = ?`, p.Secret[:]).
			Scan(&g.Household, &g.Device, &g.Scope, &issued, &expires, &used, &successor, &revoked, &removed)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return store.Refused(store.RefusedUnknown)
		case err != nil:
			return err
		case removed.Valid && removed.Int64 >= issued:
			return store.Refused(store.RefusedRemoved)
		case revoked.Valid:
			return store.Refused(store.RefusedRevoked)
		case now >= expires:
			return store.Refused(store.RefusedExpired)
		}
		if used.Valid {
			retry := false
			if now-used.Int64 < p.Grace.Microseconds() && successor != nil {
				var sUsed, sRevoked sql.NullInt64
				err := tx.QueryRowContext(ctx, `SELECT used_at, revoked_at FROM renewal_secrets WHERE secret_hash = ?`, successor).Scan(&sUsed, &sRevoked)
				if err != nil && !errors.Is(err, sql.ErrNoRows) {
					return err
				}
				retry = err == nil && !sUsed.Valid && !sRevoked.Valid
			}
			if !retry {
				refusal = store.Refused(store.RefusedReused)
				_, err := tx.ExecContext(ctx, `UPDATE renewal_secrets SET revoked_at = ? WHERE household = ? AND device = ? AND revoked_at IS NULL`,
					now, g.Household, g.Device)
				return err
			}
			// A client retrying a lost answer: what that answer carried
			// is revoked and replaced.
			if _, err := tx.ExecContext(ctx, `UPDATE renewal_secrets SET revoked_at = ? WHERE secret_hash = ?`, now, successor); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `UPDATE renewal_secrets SET successor = ? WHERE secret_hash = ?`, p.NewSecret[:], p.Secret[:]); err != nil {
				return err
			}
		} else if _, err := tx.ExecContext(ctx, `UPDATE renewal_secrets SET used_at = ?, successor = ? WHERE secret_hash = ?`,
			now, p.NewSecret[:], p.Secret[:]); err != nil {
			return err
		}
		return insertSecret(ctx, tx, g, p.NewSecret, p.Now, p.SecretExpires)
	})
	if err == nil {
		err = refusal
	}
	if err != nil {
		return store.Grant{}, err
	}
	return g, nil
}
