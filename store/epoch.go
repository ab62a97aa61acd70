package store

import (
	"crypto/rand"
	"encoding/base64"
)

// NewEpoch returns a new epoch: 12 random bytes, as 16 characters of
// base64url.
func NewEpoch() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail (it panics instead)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// ValidEpoch reports whether s may be an epoch as the protocol takes it:
// 1 to 32 characters of A-Z a-z 0-9 _ -.
func ValidEpoch(s string) bool {
	if len(s) < 1 || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
