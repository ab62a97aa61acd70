// Package edkey checks Ed25519 public keys before the relay trusts them.
// A key that is not the canonical encoding of a curve point, or that has
// small order, lets anyone produce signatures that verify; such keys are
// refused both as issuer keys and as device identity keys.
package edkey

import (
	"bytes"
	"crypto/ed25519"
	"errors"

	"filippo.io/edwards25519"
)

var (
	ErrLength       = errors.New("edkey: key is not 32 bytes")
	ErrNotCanonical = errors.New("edkey: key is not a canonical point encoding")
	ErrSmallOrder   = errors.New("edkey: key has small order")
)

// Check returns nil when b is a canonical encoding of a curve point whose
// order is not small.
func Check(b []byte) error {
	_, err := point(b)
	return err
}

// Montgomery returns the X25519 (Montgomery u-coordinate) form of a checked
// Ed25519 public key, for clients that seal envelopes to a device.
func Montgomery(b []byte) ([]byte, error) {
	p, err := point(b)
	if err != nil {
		return nil, err
	}
	return p.BytesMontgomery(), nil
}

func point(b []byte) (*edwards25519.Point, error) {
	if len(b) != ed25519.PublicKeySize {
		return nil, ErrLength
	}
	p, err := new(edwards25519.Point).SetBytes(b)
	if err != nil {
		return nil, ErrNotCanonical
	}
	// SetBytes accepts some non-canonical encodings (unreduced y, or x = 0
	// with the sign bit set); a canonical one re-encodes to itself.
	if !bytes.Equal(p.Bytes(), b) {
		return nil, ErrNotCanonical
	}
	if new(edwards25519.Point).MultByCofactor(p).Equal(edwards25519.NewIdentityPoint()) == 1 {
		return nil, ErrSmallOrder
	}
	return p, nil
}
