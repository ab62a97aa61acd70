package seal

import (
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"strings"
)

// Fingerprint returns key's short form for people to compare: 30 digits in six
// groups of five, from SHA-256("fn-seal v1 fingerprint" || 0x00 || key).
func Fingerprint(key ed25519.PublicKey) string {
	h := sha256.New()
	h.Write([]byte("fn-seal v1 fingerprint\x00"))
	h.Write(key)
	sum := h.Sum(nil)
	groups := make([]string, 6)
	for i := range groups {
		var n uint64
		for _, b := range sum[5*i : 5*i+5] {
			n = n<<8 | uint64(b)
		}
		groups[i] = fmt.Sprintf("%05d", n%100000)
	}
	return strings.Join(groups, " ")
}

// Fingerprint returns the identity's own fingerprint.
func (id *Identity) Fingerprint() string { return Fingerprint(id.Public()) }

// SafetyNumber returns what two devices compare to know they hold each other's
// keys: their two fingerprints in string order, 60 digits. Both devices
// compute the same number.
func SafetyNumber(a, b ed25519.PublicKey) string {
	fa, fb := Fingerprint(a), Fingerprint(b)
	if fb < fa {
		fa, fb = fb, fa
	}
	return fa + " " + fb
}
