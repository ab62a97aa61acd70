package pairing

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"strings"
)

// codeAlphabet is Crockford's base32: no I, L, O or U.
const codeAlphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// codeLen is an invitation code's length without its dash: 50 bits.
const codeLen = 10

// newCode is a fresh invitation code: 50 bits from crypto/rand in
// Crockford's base32, as two groups of five joined by a dash.
func newCode() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	n := binary.BigEndian.Uint64(b[:])
	out := make([]byte, 0, codeLen+1)
	for i := range codeLen {
		if i == codeLen/2 {
			out = append(out, '-')
		}
		out = append(out, codeAlphabet[n&31])
		n >>= 5
	}
	return string(out)
}

// normalizeCode reads a code as a person may have typed it: any case,
// with or without dashes and spaces, O for 0 and I or L for 1. ok is false
// for anything else that is not ten characters of the alphabet.
func normalizeCode(s string) (code string, ok bool) {
	if len(s) > 64 {
		return "", false
	}
	out := make([]byte, 0, codeLen)
	for _, c := range []byte(strings.ToUpper(s)) {
		switch c {
		case '-', ' ':
			continue
		case 'O':
			c = '0'
		case 'I', 'L':
			c = '1'
		}
		if strings.IndexByte(codeAlphabet, c) < 0 {
			return "", false
		}
		out = append(out, c)
	}
	if len(out) != codeLen {
		return "", false
	}
	return string(out), true
}

// renewalPrefix starts every renewal secret: its version.
const renewalPrefix = "fnr1."

// NewRenewalSecret is "fnr1." and 32 random bytes in unpadded base64url.
func NewRenewalSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return renewalPrefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// ValidRenewalSecret says whether s has a renewal secret's one spelling.
func ValidRenewalSecret(s string) bool {
	rest, ok := strings.CutPrefix(s, renewalPrefix)
	if !ok || len(rest) != 43 {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	return err == nil && len(b) == 32
}
