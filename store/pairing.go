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
	// RefusedReused: a renewal secret used before, outside the retry
	// grace: every renewal secret of the device was revoked.
	RefusedReused = "reused"
)

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
}

// InvitationsParams lists a household's invitations: those not redeemed
// and not expired at Now, and those redeemed at or after RedeemedSince.
type InvitationsParams struct {
	Household     string
	Now           time.Time
	RedeemedSince time.Time
}

// PairParams redeems an invitation: registers its device (with
// IdentityKey when not nil), marks the invitation used and stores the
// device's first renewal secret, all in one transaction or nothing.
type PairParams struct {
	Code        SecretHash
	IdentityKey []byte
	Now         time.Time
	Secret      SecretHash
	// SecretExpires is when the new renewal secret expires.
	SecretExpires time.Time
}

// RenewParams exchanges a renewal secret for a new one.
type RenewParams struct {
	Secret        SecretHash
	NewSecret     SecretHash
	Now           time.Time
	SecretExpires time.Time
	// Grace is how long after a secret's use the same secret is taken for
	// a client retrying a lost answer (while the secret issued for it is
	// still unused): that secret is then revoked and NewSecret issued.
	// Any other reuse revokes every renewal secret of the device.
	Grace time.Duration
}

// Grant is what a pairing or a renewal grants: the device credentials are
// minted for.
type Grant struct {
	Household string
	Device    string
	Scope     string
}

// InvitationsKept is how long an invitation is kept after it expired or
// was redeemed, for an admin to see which device redeemed it.
const InvitationsKept = 24 * time.Hour
