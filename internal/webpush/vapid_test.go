package webpush

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"strings"
	"testing"
	"time"
)

// TestVAPIDHeader: the header is "vapid t=JWT, k=KEY"; the JWT is ES256
// over aud (the endpoint's origin), exp (12 h on) and sub, and verifies
// under the k it names; a token is reused for one origin and not for
// another, and is signed anew past half its life.
func TestVAPIDHeader(t *testing.T) {
	key, err := GenerateVAPIDKey()
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVAPID(key, "mailto:ops@relay.example")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	h, err := v.Authorization("https://push.example:8443/p/abc?x=1", now)
	if err != nil {
		t.Fatal(err)
	}
	tok, k, ok := strings.Cut(strings.TrimPrefix(h, "vapid t="), ", k=")
	if !ok || !strings.HasPrefix(h, "vapid t=") || k != v.PublicKey() {
		t.Fatalf("header %q", h)
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q", tok)
	}
	var header, claims map[string]any
	dec := base64.RawURLEncoding
	hb, _ := dec.DecodeString(parts[0])
	cb, _ := dec.DecodeString(parts[1])
	_ = json.Unmarshal(hb, &header)
	_ = json.Unmarshal(cb, &claims)
	if header["alg"] != "ES256" || claims["aud"] != "https://push.example:8443" || claims["sub"] != "mailto:ops@relay.example" ||
		claims["exp"] != float64(now.Add(12*time.Hour).Unix()) {
		t.Errorf("header %v, claims %v", header, claims)
	}
	pubBytes, _ := dec.DecodeString(k)
	pub, err := ecdsa.ParseUncompressedPublicKey(key.Curve, pubBytes)
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := dec.DecodeString(parts[2])
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if len(sig) != 64 || !ecdsa.Verify(pub, digest[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])) {
		t.Error("the signature does not verify under k")
	}
	again, _ := v.Authorization("https://push.example:8443/p/other", now.Add(time.Hour))
	other, _ := v.Authorization("https://elsewhere.example/p", now.Add(time.Hour))
	later, _ := v.Authorization("https://push.example:8443/p/abc", now.Add(7*time.Hour))
	if again != h || other == h || later == h {
		t.Error("tokens are not reused per origin for half their life, or are reused past it")
	}
}

// TestVAPIDSubjectAndKey: the subject must be mailto: or https:; a key
// round-trips through its base64url form.
func TestVAPIDSubjectAndKey(t *testing.T) {
	for _, s := range []string{"mailto:a@b.example", "https://relay.example", "https://relay.example/contact"} {
		if err := CheckSubject(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	for _, s := range []string{"", "a@b.example", "http://relay.example", "mailto:nobody", "https://", "tel:+1"} {
		if err := CheckSubject(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
	key, _ := GenerateVAPIDKey()
	s, err := FormatVAPIDKey(key)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseVAPIDKey(s + "\n")
	if err != nil || !back.Equal(key) {
		t.Fatalf("round trip: %v", err)
	}
	if _, err := ParseVAPIDKey("c2hvcnQ"); err == nil {
		t.Error("a short key accepted")
	}
}
