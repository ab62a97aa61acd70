package pairing

import (
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"strings"

	"github.com/flamenet/relay/store"
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

// Renewal secrets are spelled as a version, a dot and unpadded base64url.
// The first version (fnr1) is 32 random bytes; the second (fnr2) adds a
// tag, the first 16 bytes of an HMAC-SHA256 of them under a key derived
// from the issuer key, so that the relay knows one of its own secrets
// without a store read: those get a budget of their own (see Renew), and
// guesses, which cannot make a tag, keep to the guess limits.
const (
	renewalPrefix   = "fnr1."
	renewalPrefixV2 = "fnr2."
	secretRandom    = 32
	secretTag       = 16
)

// NewRenewalSecret is a renewal secret of the first version: "fnr1." and
// 32 random bytes, the spelling relays issued before fnr2, still taken.
func NewRenewalSecret() string {
	var b [secretRandom]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return renewalPrefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// ValidRenewalSecret says whether s has one of a renewal secret's
// spellings (its tag is not checked).
func ValidRenewalSecret(s string) bool {
	if rest, ok := strings.CutPrefix(s, renewalPrefix); ok {
		return decodeExactly(rest, secretRandom) != nil
	}
	if rest, ok := strings.CutPrefix(s, renewalPrefixV2); ok {
		return decodeExactly(rest, secretRandom+secretTag) != nil
	}
	return false
}

// decodeExactly is s decoded as unpadded base64url of n bytes in its one
// spelling, or nil.
func decodeExactly(s string, n int) []byte {
	if len(s) != base64.RawURLEncoding.EncodedLen(n) {
		return nil
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(b) != n {
		return nil
	}
	return b
}

// keys are pairing's keys, derived from the issuer key: one to tag
// renewal secrets, one to keep invitation codes by (codes are short
// enough that a plain hash of one is found by trying them all).
type keys struct {
	tag  []byte
	code []byte
}

func deriveKeys(issuer ed25519.PrivateKey) keys {
	derive := func(purpose string) []byte {
		k, err := hkdf.Key(sha256.New, issuer.Seed(), nil, "flamenet relay pairing: "+purpose, sha256.Size)
		if err != nil {
			panic(err) // only for a length HKDF cannot give
		}
		return k
	}
	return keys{tag: derive("renewal secret tag"), code: derive("invitation code hash")}
}

func (k keys) mac(key, msg []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	return m.Sum(nil)
}

// newSecret is a fresh renewal secret of the second version, tagged.
func (k keys) newSecret() string {
	b := make([]byte, secretRandom, secretRandom+secretTag)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	b = append(b, k.mac(k.tag, b)[:secretTag]...)
	return renewalPrefixV2 + base64.RawURLEncoding.EncodeToString(b)
}

// vouched says whether s is a second-version secret with a good tag: one
// this relay (or one with its issuer key) made.
func (k keys) vouched(s string) bool {
	rest, ok := strings.CutPrefix(s, renewalPrefixV2)
	if !ok {
		return false
	}
	b := decodeExactly(rest, secretRandom+secretTag)
	return b != nil && hmac.Equal(b[secretRandom:], k.mac(k.tag, b[:secretRandom])[:secretTag])
}

// hashCode is how the store keeps an invitation code (normalizeCode's
// spelling): its HMAC under the code key, so that a copy of the database
// without the issuer key gives no code away.
func (k keys) hashCode(code string) store.SecretHash {
	return store.SecretHash(k.mac(k.code, []byte(code)))
}
