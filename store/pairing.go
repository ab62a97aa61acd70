package store

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"time"
)

// ErrRefused is the refusal of an invitation code or renewal secret. The
// error is a *RefusedError, whose Reason is for the log only: every refusal
// looks the same to the client.
var ErrRefused = errors.New("store: credential refused")

// Why a code or secret was refused, in RefusedError.Reason.
const (
	RefusedUnknown = "unknown" // no such code or secret
	RefusedExpired = "expired"
	RefusedUsed    = "used"    // an invitation redeemed before
	RefusedRevoked = "revoked" // a renewal secret revoked (replaced on a retry, or by reuse detection)
	RefusedRemoved = "removed" // issued before the device's last removal
	// RefusedTaken: an invitation for a name that became a device after
	// it was made, which does not replace that device.
	RefusedTaken = "taken"
	// RefusedReused: a renewal secret used before, beyond the one retry
	// the grace allows: every renewal secret of the device was revoked.
	RefusedReused = "reused"
	// RefusedScope: an invitation of a scope other than the one asked
	// for; it is not redeemed.
	RefusedScope = "scope"
)

// ErrDeviceExists is CreateInvitation's refusal of an invitation for a
// device that exists, unless it replaces that device.
var ErrDeviceExists = errors.New("store: device exists")

// RefusedError says why a code or secret was refused.
type RefusedError struct {
	Reason string
}

func (e *RefusedError) Error() string { return fmt.Sprintf("store: credential refused (%s)", e.Reason) }

func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// Refused is the error of a refusal for reason.
func Refused(reason string) error { return &RefusedError{Reason: reason} }

// SecretHash is how the store keeps an invitation code or a renewal
// secret: its SHA-256, never the secret itself.
type SecretHash [sha256.Size]byte

// HashSecret is s's SecretHash.
func HashSecret(s string) SecretHash { return sha256.Sum256([]byte(s)) }

// InviteParams creates an invitation for a device, replacing an
// unredeemed one of the same device.
type InviteParams struct {
	Household string
	Device    string
	Scope     string
	Code      SecretHash
	Now       time.Time
	Expires   time.Time
	// Replace: the device may exist, and redeeming the invitation removes
	// it (its envelopes, credentials and key) before the new device takes
	// the name. Without it, an invitation for a device that exists is
	// ErrDeviceExists, and one whose name became a device before it was
	// redeemed is refused (RefusedTaken).
	Replace bool
	// CreatedBy is the device that made the invitation, if any: its
	// removal deletes the invitations it made that are not redeemed.
	CreatedBy string
}

// Invitation is one invitation as an admin may see it: never its code.
type Invitation struct {
	Household   string
	Device      string
	Scope       string
	CreatedAt   time.Time
	ExpiresAt   time.Time
	RedeemedAt  time.Time // zero: not redeemed
	IdentityKey []byte    // the identity key the redeeming device gave, or nil
	Replace     bool      // redeeming it replaces the device (see InviteParams)
	CreatedBy   string    // the device that made it, or ""
}

// InvitationsParams lists a household's invitations: those not redeemed
// and not expired at Now, and those redeemed at or after RedeemedSince.
type InvitationsParams struct {
	Household     string
	Now           time.Time
	RedeemedSince time.Time
}

// PairParams redeems an invitation: removes the device it replaces, if
// any, registers its device (with IdentityKey when not nil), marks the
// invitation used and stores the device's first renewal secret, revoking
// any other, all in one transaction or nothing.
type PairParams struct {
	Code        SecretHash
	IdentityKey []byte
	Now         time.Time
	Secret      SecretHash
	// SecretExpires is when the new renewal secret expires.
	SecretExpires time.Time
	// Scope, when set, is the only scope the caller can use: an
	// invitation of another is refused (RefusedScope) and stays unspent.
	Scope string
}

// RenewParams exchanges a renewal secret for a new one.
type RenewParams struct {
	Secret        SecretHash
	NewSecret     SecretHash
	Now           time.Time
	SecretExpires time.Time
	// Grace is how long after a secret's use the same secret is taken,
	// once, for a client retrying a lost answer, while the secret issued
	// for it is still unused: that secret is then revoked and NewSecret
	// issued. Any other use of a secret that was used or revoked, by
	// anyone, revokes every renewal secret of the device: a device's
	// secrets since its pairing are one family.
	Grace time.Duration
}

// Grant is what a pairing or a renewal grants: the device credentials are
// minted for.
type Grant struct {
	Household string
	Device    string
	Scope     string
	// RemovedAt is the device's last removal, zero if none: credentials
	// minted for the grant must be issued after it.
	RemovedAt time.Time
	// Replaced: the pairing removed the device that had the name, at
	// RemovedAt.
	Replaced bool
}

// IssuedAfter is now, or the microsecond after removed if that is later:
// a credential for a device is issued after its last removal, or the
// removal refuses it (a relay's clock may read behind the one that
// recorded the removal).
func IssuedAfter(now, removed time.Time) time.Time {
	if next := removed.Add(time.Microsecond); now.Before(next) {
		return next
	}
	return now
}

// InvitationsKept is how long an invitation is kept after it expired or
// was redeemed, for an admin to see which device redeemed it.
const InvitationsKept = 24 * time.Hour
