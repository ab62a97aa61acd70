package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/flamenet/relay/store"
)

// forget deletes a removed device's invitations, the unredeemed ones it
// made, and its renewal secrets, inside its removal's transaction; keep is
// the code of an invitation that is not deleted (the one whose pairing
// replaces the device), or nil.
func forget(ctx context.Context, tx *sql.Tx, household, device string, keep []byte) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM invitations WHERE household = ?1 AND
		(device = ?2 OR (created_by = ?2 AND redeemed_at IS NULL)) AND code_hash IS NOT ?3`, household, device, keep); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `DELETE FROM renewal_secrets WHERE household = ? AND device = ?`, household, device)
	return err
}

// removeDevice is DeleteDevice's work on tx (forget's keep included); it
// returns the removal as recorded.
func removeDevice(ctx context.Context, tx *sql.Tx, household, device string, at time.Time, keep []byte) (time.Time, error) {
	if _, err := tx.ExecContext(ctx, `DELETE FROM envelopes WHERE household = ? AND device = ?`,
		household, device); err != nil {
		return time.Time{}, err
	}
	if err := forget(ctx, tx, household, device, keep); err != nil {
		return time.Time{}, err
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM devices WHERE household = ? AND name = ?`, household, device)
	if err != nil {
		return time.Time{}, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return time.Time{}, err
	} else if n == 0 {
		return time.Time{}, fmt.Errorf("device %q: %w", device, store.ErrNotFound)
	}
	// A removal never moves back: one recorded later (by a relay whose
	// clock is ahead) stays.
	var removed int64
	err = tx.QueryRowContext(ctx, `INSERT INTO removals (household, device, removed_at) VALUES (?, ?, ?)
		ON CONFLICT (household, device) DO UPDATE SET removed_at = max(removed_at, excluded.removed_at)
		RETURNING removed_at`, household, device, micros(at)).Scan(&removed)
	return fromMicros(removed), err
}

// CreateInvitation stores p, replacing the device's unredeemed invitation,
// and drops the household's invitations that nobody may list any more.
func (db *DB) CreateInvitation(ctx context.Context, p store.InviteParams) error {
	return db.write(ctx, "create invitation", func(tx *sql.Tx) error {
		if !p.Replace {
			var exists bool
			if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM devices WHERE household = ? AND name = ?)`,
				p.Household, p.Device).Scan(&exists); err != nil {
				return err
			}
			if exists {
				return fmt.Errorf("sqlite: invite %q: %w", p.Device, store.ErrDeviceExists)
			}
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM invitations WHERE household = ?1 AND
			((device = ?2 AND redeemed_at IS NULL) OR expires_at < ?3)`,
			p.Household, p.Device, micros(p.Now.Add(-store.InvitationsKept))); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO invitations (code_hash, household, device, scope, created_at, expires_at, replaces, created_by)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, p.Code[:], p.Household, p.Device, p.Scope, micros(p.Now), micros(p.Expires),
			p.Replace, nullString(p.CreatedBy))
		return err
	})
}

// CancelInvitation deletes the device's unredeemed invitation.
func (db *DB) CancelInvitation(ctx context.Context, household, device string) error {
	return db.write(ctx, "cancel invitation", func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM invitations WHERE household = ? AND device = ? AND redeemed_at IS NULL`,
			household, device)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return fmt.Errorf("sqlite: cancel invitation %q: %w", device, store.ErrNotFound)
		}
		return nil
	})
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Invitations lists the household's pending and recently redeemed
// invitations, by device.
func (db *DB) Invitations(ctx context.Context, p store.InvitationsParams) ([]store.Invitation, error) {
	rows, err := db.reader.QueryContext(ctx, `SELECT household, device, scope, created_at, expires_at, redeemed_at, identity_key,
			replaces, coalesce(created_by, '')
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
		if err := rows.Scan(&in.Household, &in.Device, &in.Scope, &created, &expires, &redeemed, &in.IdentityKey,
			&in.Replace, &in.CreatedBy); err != nil {
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
			redeemed, remove sql.NullInt64
			taken            bool
		)
		err := tx.QueryRowContext(ctx, `SELECT i.household, i.device, i.scope, i.created_at, i.expires_at, i.redeemed_at, i.replaces,
				EXISTS (SELECT 1 FROM devices d WHERE d.household = i.household AND d.name = i.device),
				(SELECT removed_at FROM removals r WHERE r.household = i.household AND r.device = i.device)
			FROM invitations i WHERE code_hash = ?`, p.Code[:]).
			Scan(&g.Household, &g.Device, &g.Scope, &created, &expires, &redeemed, &g.Replaced, &taken, &remove)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return store.Refused(store.RefusedUnknown)
		case err != nil:
			return err
		case p.Scope != "" && g.Scope != p.Scope:
			return store.Refused(store.RefusedScope)
		case redeemed.Valid:
			return store.Refused(store.RefusedUsed)
		case micros(p.Now) >= expires:
			return store.Refused(store.RefusedExpired)
		case remove.Valid && remove.Int64 >= created:
			// An invitation made at or before the device's last removal
			// belongs to an earlier life and brings nothing back.
			return store.Refused(store.RefusedRemoved)
		case taken && !g.Replaced:
			return store.Refused(store.RefusedTaken)
		}
		issuedAt := fromMicros(created)
		if remove.Valid {
			g.RemovedAt = fromMicros(remove.Int64)
		}
		if g.Replaced = taken; taken {
			// A removal, then a new life: the old device's credentials,
			// envelopes and key go, and the new one registers after it.
			if g.RemovedAt, err = removeDevice(ctx, tx, g.Household, g.Device, p.Now, p.Code[:]); err != nil {
				return err
			}
			issuedAt = g.RemovedAt.Add(time.Microsecond)
		}
		_, err = register(ctx, tx, store.RegisterParams{Household: g.Household, Device: g.Device,
			IdentityKey: p.IdentityKey, Now: p.Now, IssuedAt: issuedAt})
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
		// A pairing starts the device's family of secrets anew.
		if _, err := tx.ExecContext(ctx, `DELETE FROM renewal_secrets WHERE household = ? AND device = ?`,
			g.Household, g.Device); err != nil {
			return err
		}
		return insertSecret(ctx, tx, g, p.Secret, p.Now, store.IssuedAfter(p.Now, g.RemovedAt), p.SecretExpires)
	})
	if err != nil {
		return store.Grant{}, err
	}
	return g, nil
}

// insertSecret stores secret, issued at issuedAt.
func insertSecret(ctx context.Context, tx *sql.Tx, g store.Grant, secret store.SecretHash, now, issuedAt, expires time.Time) error {
	// The device's expired secrets go on the way: reuse of an expired
	// secret is refused as expired or unknown alike.
	if _, err := tx.ExecContext(ctx, `DELETE FROM renewal_secrets WHERE household = ? AND device = ? AND expires_at <= ?`,
		g.Household, g.Device, micros(now)); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO renewal_secrets (secret_hash, household, device, scope, issued_at, expires_at)
		VALUES (?, ?, ?, ?, ?, ?)`, secret[:], g.Household, g.Device, g.Scope, micros(issuedAt), micros(expires))
	return err
}

// revokeFamily revokes every renewal secret of g's device.
func revokeFamily(ctx context.Context, tx *sql.Tx, g store.Grant, now int64) error {
	_, err := tx.ExecContext(ctx, `UPDATE renewal_secrets SET revoked_at = ? WHERE household = ? AND device = ? AND revoked_at IS NULL`,
		now, g.Household, g.Device)
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
			issued, expires        int64
			used, revoked, retried sql.NullInt64
			successor              []byte
			removed                sql.NullInt64
		)
		err := tx.QueryRowContext(ctx, `SELECT s.household, s.device, s.scope, s.issued_at, s.expires_at, s.used_at, s.successor, s.revoked_at, s.retried_at,
				(SELECT removed_at FROM removals r WHERE r.household = s.household AND r.device = s.device)
			FROM renewal_secrets s WHERE secret_hash = ?`, p.Secret[:]).
			Scan(&g.Household, &g.Device, &g.Scope, &issued, &expires, &used, &successor, &revoked, &retried, &removed)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return store.Refused(store.RefusedUnknown)
		case err != nil:
			return err
		case removed.Valid && removed.Int64 >= issued:
			return store.Refused(store.RefusedRemoved)
		case now >= expires:
			return store.Refused(store.RefusedExpired)
		case revoked.Valid:
			// Whoever presents it, the family it belongs to is no longer
			// trusted: the holder of its live secret may be a thief.
			refusal = store.Refused(store.RefusedRevoked)
			return revokeFamily(ctx, tx, g, now)
		}
		if removed.Valid {
			g.RemovedAt = fromMicros(removed.Int64)
		}
		if used.Valid {
			retry := false
			if !retried.Valid && now-used.Int64 < p.Grace.Microseconds() && successor != nil {
				var sUsed, sRevoked sql.NullInt64
				err := tx.QueryRowContext(ctx, `SELECT used_at, revoked_at FROM renewal_secrets WHERE secret_hash = ?`, successor).Scan(&sUsed, &sRevoked)
				if err != nil && !errors.Is(err, sql.ErrNoRows) {
					return err
				}
				retry = err == nil && !sUsed.Valid && !sRevoked.Valid
			}
			if !retry {
				refusal = store.Refused(store.RefusedReused)
				return revokeFamily(ctx, tx, g, now)
			}
			// A client retrying a lost answer, once: what that answer
			// carried is revoked and replaced.
			if _, err := tx.ExecContext(ctx, `UPDATE renewal_secrets SET revoked_at = ? WHERE secret_hash = ?`, now, successor); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `UPDATE renewal_secrets SET successor = ?, retried_at = ? WHERE secret_hash = ?`,
				p.NewSecret[:], now, p.Secret[:]); err != nil {
				return err
			}
		} else if _, err := tx.ExecContext(ctx, `UPDATE renewal_secrets SET used_at = ?, successor = ? WHERE secret_hash = ?`,
			now, p.NewSecret[:], p.Secret[:]); err != nil {
			return err
		}
		return insertSecret(ctx, tx, g, p.NewSecret, p.Now, store.IssuedAfter(p.Now, g.RemovedAt), p.SecretExpires)
	})
	if err == nil {
		err = refusal
	}
	if err != nil {
		return store.Grant{}, err
	}
	return g, nil
}
