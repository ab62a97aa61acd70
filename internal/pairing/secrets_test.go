package pairing

import (
	"crypto/ed25519"
	"regexp"
	"strings"
	"testing"
)

// TestCodeShape: codes are ten characters of Crockford's base32 in two
// groups, and differ; the alphabet's 32 characters all occur.
func TestCodeShape(t *testing.T) {
	re := regexp.MustCompile(`^[0-9A-HJKMNP-TV-Z]{5}-[0-9A-HJKMNP-TV-Z]{5}$`)
	seen := map[string]bool{}
	chars := map[rune]bool{}
	for range 2000 {
		c := newCode()
		if !re.MatchString(c) {
			t.Fatalf("code %q is not two groups of five Crockford base32 characters", c)
		}
		if seen[c] {
			t.Fatalf("code %q drawn twice in 2000 (50 bits each)", c)
		}
		seen[c] = true
		for _, r := range c {
			chars[r] = true
		}
	}
	if len(chars) != 33 { // 32 and the dash
		t.Errorf("2000 codes used %d characters, want all 32 and the dash", len(chars))
	}
	for _, n := range []string{"ABCDE-FGHJK"} {
		if got, ok := normalizeCode(n); !ok || got != "ABCDEFGHJK" {
			t.Errorf("normalizeCode(%q) = %q, %v", n, got, ok)
		}
	}
}

// TestCodeNormalization: a code redeems however it is typed (case,
// dashes, spaces, O for 0, I and L for 1); anything else outside the
// alphabet is the same refusal as a wrong code.
func TestCodeNormalization(t *testing.T) {
	for _, tt := range []struct {
		name, in, want string
		ok             bool
	}{
		{"canonical", "ABCDE-FGHJK", "ABCDEFGHJK", true},
		{"lower, no dash", "abcdefghjk", "ABCDEFGHJK", true},
		{"spaces", " AB CDE FGH JK ", "ABCDEFGHJK", true},
		{"O I L", "O0IIL-1lioo", "0011111100", true},
		{"U", "ABCDE-FGHJU", "", false},
		{"short", "ABCDE-FGHJ", "", false},
		{"long", "ABCDE-FGHJKM", "", false},
		{"punctuation", "ABCDE_FGHJK", "", false},
		{"unicode", "ABCDE-FGHJĸ", "", false},
		{"empty", "", "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := normalizeCode(tt.in)
			if got != tt.want || ok != tt.ok {
				t.Errorf("normalizeCode(%q) = %q, %v, want %q, %v", tt.in, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestRenewalSecretSpelling: a first-version secret has the one spelling;
// any other (another version's length or prefix, padding, standard
// base64, a byte short) is
// refused before the store is asked.
func TestRenewalSecretSpelling(t *testing.T) {
	s := NewRenewalSecret()
	if !ValidRenewalSecret(s) || NewRenewalSecret() == s {
		t.Fatalf("fresh secret %q refused, or drawn twice", s)
	}
	rest := strings.TrimPrefix(s, renewalPrefix)
	for _, bad := range []string{"fnr2." + rest, "fnr3." + rest, s + "=", renewalPrefix + rest[:42], renewalPrefix + rest[:42] + "+", "", rest} {
		if ValidRenewalSecret(bad) {
			t.Errorf("%q taken for a renewal secret", bad)
		}
	}
}

// TestRenewalSecretShape: a second-version secret is "fnr2." and 48 bytes
// in unpadded base64url; its tag vouches for it under the key it was made
// with only: not under another issuer key, not with a bit of it changed,
// and never for a first-version secret. Invitation codes are kept by an
// HMAC that another key gives otherwise.
func TestRenewalSecretShape(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(nil)
	_, other, _ := ed25519.GenerateKey(nil)
	k, o := deriveKeys(priv), deriveKeys(other)
	s := k.newSecret()
	if !regexp.MustCompile(`^fnr2\.[A-Za-z0-9_-]{64}$`).MatchString(s) || !ValidRenewalSecret(s) || k.newSecret() == s {
		t.Fatalf("fresh secret %q: bad shape, or drawn twice", s)
	}
	if !k.vouched(s) {
		t.Fatal("a secret is not vouched for by the key it was made with")
	}
	if o.vouched(s) {
		t.Error("another issuer key vouches for the secret")
	}
	b := []byte(s)
	b[10] ^= 1 // one bit of the random part
	if k.vouched(string(b)) {
		t.Error("a secret with a changed bit is vouched for")
	}
	if k.vouched(NewRenewalSecret()) || k.vouched("fnr2."+strings.Repeat("A", 64)) {
		t.Error("a first-version or made-up secret is vouched for")
	}
	first, again := k.hashCode("ABCDE12345"), k.hashCode("ABCDE12345")
	if first == o.hashCode("ABCDE12345") || first != again {
		t.Error("a code's hash does not depend on the key alone")
	}
}
