package token

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func newKey(tb testing.TB) ed25519.PrivateKey {
	tb.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// forge builds a token with an arbitrary header and claims, signed by sign.
func forge(tb testing.TB, hdr, claims any, sign func([]byte) []byte) string {
	tb.Helper()
	hb, err := json.Marshal(hdr)
	if err != nil {
		tb.Fatal(err)
	}
	cb, err := json.Marshal(claims)
	if err != nil {
		tb.Fatal(err)
	}
	s := b64.EncodeToString(hb) + "." + b64.EncodeToString(cb)
	return s + "." + b64.EncodeToString(sign([]byte(s)))
}

func TestVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	key := newKey(t)
	other := newKey(t)
	pub := key.Public().(ed25519.PublicKey)
	keys := []ed25519.PublicKey{other.Public().(ed25519.PublicKey), pub}

	valid := Claims{Household: "home", Device: "phone", Expires: now.Add(time.Hour), IssuedAt: now}
	mint := func(c Claims, k ed25519.PrivateKey) string {
		s, err := Mint(k, c)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	with := func(f func(*Claims)) Claims { c := valid; f(&c); return c }
	edSign := func(b []byte) []byte { return ed25519.Sign(key, b) }
	claims := map[string]any{"hh": "home", "sub": "phone", "exp": now.Add(time.Hour).Unix()}

	tests := []struct {
		name  string
		token string
		want  error
	}{
		{"valid", mint(valid, key), nil},
		{"admin scope", mint(with(func(c *Claims) { c.Scope = ScopeAdmin }), key), nil},
		{"expired within skew", mint(with(func(c *Claims) { c.Expires = now.Add(-59 * time.Second) }), key), nil},
		{"expired", mint(with(func(c *Claims) { c.Expires = now.Add(-61 * time.Second) }), key), ErrExpired},
		{"nbf within skew", mint(with(func(c *Claims) { c.NotBefore = now.Add(59 * time.Second) }), key), nil},
		{"future nbf", mint(with(func(c *Claims) { c.NotBefore = now.Add(61 * time.Second) }), key), ErrNotYetValid},
		{"iat within skew", mint(with(func(c *Claims) { c.IssuedAt = now.Add(59 * time.Second) }), key), nil},
		{"future iat", mint(with(func(c *Claims) { c.IssuedAt = now.Add(61 * time.Second) }), key), ErrFutureIssue},
		{"iat in 2286", mint(with(func(c *Claims) { c.IssuedAt = time.Unix(9_999_999_999, 0) }), key), ErrFutureIssue},
		{"no hh", forge(t, map[string]string{"alg": "EdDSA"}, map[string]any{"sub": "phone", "exp": now.Add(time.Hour).Unix()}, edSign), ErrClaims},
		{"signature spelled twice", respell(mint(valid, key), 2), ErrMalformed},
		{"wrong key", mint(valid, newKey(t)), ErrSignature},
		{"alg none", forge(t, map[string]string{"alg": "none", "typ": "JWT"}, claims, func([]byte) []byte { return nil }), ErrAlgorithm},
		{"alg none signed", forge(t, map[string]string{"alg": "none"}, claims, edSign), ErrAlgorithm},
		{"HS256 with public key as secret", forge(t, map[string]string{"alg": "HS256"}, claims, func(b []byte) []byte {
			m := hmac.New(sha256.New, pub)
			m.Write(b)
			return m.Sum(nil)
		}), ErrAlgorithm},
		{"ES256 header", forge(t, map[string]string{"alg": "ES256"}, claims, edSign), ErrAlgorithm},
		{"crit header", forge(t, map[string]any{"alg": "EdDSA", "crit": []string{"x"}}, claims, edSign), ErrMalformed},
		{"tampered claims", tamper(mint(valid, key)), ErrSignature},
		{"oversize", mint(with(func(c *Claims) { c.Scope = strings.Repeat("a", MaxLen) }), key), ErrTooLong},
		{"no exp", forge(t, map[string]string{"alg": "EdDSA"}, map[string]any{"hh": "home", "sub": "phone"}, edSign), ErrClaims},
		{"no sub", forge(t, map[string]string{"alg": "EdDSA"}, map[string]any{"hh": "home", "exp": now.Add(time.Hour).Unix()}, edSign), ErrClaims},
		{"exp not a number", forge(t, map[string]string{"alg": "EdDSA"}, map[string]any{"hh": "home", "sub": "phone", "exp": true}, edSign), ErrMalformed},
		{"unknown scope", mint(with(func(c *Claims) { c.Scope = "root" }), key), ErrUnknownScope},
		{"two parts", "a.b", ErrMalformed},
		{"four parts", mint(valid, key) + ".x", ErrMalformed},
		{"empty", "", ErrMalformed},
		{"bad base64", "!!!.e30.AAAA", ErrMalformed},
		{"short signature", strings.Join(strings.Split(mint(valid, key), ".")[:2], ".") + ".AAAA", ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Verify(tt.token, keys, now)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if c.Household != "home" || c.Device != "phone" {
					t.Fatalf("claims = %+v", c)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("Verify err = %v, want %v", err, tt.want)
			}
		})
	}
}

// respell changes the spare low bits of part's last character, which a
// lenient decoder ignores: the same bytes, another spelling. (The header
// and claims are signed as spelled; the signature is not, so that is the
// part whose spelling could vary.)
func respell(tok string, part int) string {
	parts := strings.Split(tok, ".")
	p := parts[part]
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, p[len(p)-1])
	parts[part] = p[:len(p)-1] + string(alphabet[last^1])
	return strings.Join(parts, ".")
}

// TestOneSpelling: the respelled signature TestVerify refuses decodes to
// the same bytes under a lenient decoder, so it really is another spelling
// that a lenient Verify would accept.
func TestOneSpelling(t *testing.T) {
	key := newKey(t)
	tok, err := Mint(key, Claims{Household: "home", Device: "phone", Expires: time.Unix(1_800_000_000, 0)})
	if err != nil {
		t.Fatal(err)
	}
	lenient := base64.RawURLEncoding
	for _, part := range []int{2} {
		a, b := strings.Split(tok, ".")[part], strings.Split(respell(tok, part), ".")[part]
		da, errA := lenient.DecodeString(a)
		db, errB := lenient.DecodeString(b)
		if a == b || errA != nil || errB != nil || string(da) != string(db) {
			t.Fatalf("part %d: %q and %q are not two spellings of one value", part, a, b)
		}
	}
}

// TestEmptyNames: a validly signed token whose hh or sub is empty verifies
// (the names are the caller's to refuse, with 400); a missing one does not.
func TestEmptyNames(t *testing.T) {
	key := newKey(t)
	now := time.Unix(1_800_000_000, 0)
	for _, c := range []Claims{{Device: "phone"}, {Household: "home"}} {
		hh, sub := c.Household, c.Device
		tok := forge(t, map[string]string{"alg": "EdDSA"}, map[string]any{"hh": hh, "sub": sub, "exp": now.Add(time.Hour).Unix()}, func(b []byte) []byte { return ed25519.Sign(key, b) })
		got, err := Verify(tok, []ed25519.PublicKey{key.Public().(ed25519.PublicKey)}, now)
		if err != nil || got.Household != hh || got.Device != sub {
			t.Fatalf("hh %q sub %q: %+v, %v", hh, sub, got, err)
		}
	}
}

// tamper changes the device in the claims but keeps the signature.
func tamper(tok string) string {
	parts := strings.Split(tok, ".")
	b, _ := b64.DecodeString(parts[1])
	b = []byte(strings.Replace(string(b), `"phone"`, `"laptop"`, 1))
	parts[1] = b64.EncodeToString(b)
	return strings.Join(parts, ".")
}

func TestMintRoundTrip(t *testing.T) {
	key := newKey(t)
	now := time.Unix(1_800_000_000, 0)
	in := Claims{Household: "h", Device: "d", Expires: now.Add(time.Minute), IssuedAt: now, NotBefore: now, Scope: ScopeAdmin}
	tok, err := Mint(key, in)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Verify(tok, []ed25519.PublicKey{key.Public().(ed25519.PublicKey)}, now)
	if err != nil {
		t.Fatal(err)
	}
	if got != in {
		t.Fatalf("got %+v, want %+v", got, in)
	}
	// A device-scoped token without iat: IssuedAt stays zero so the caller
	// can refuse it for a removed device.
	tok, _ = Mint(key, Claims{Household: "h", Device: "d", Expires: now.Add(time.Minute)})
	got, err = Verify(tok, []ed25519.PublicKey{key.Public().(ed25519.PublicKey)}, now)
	if err != nil || !got.IssuedAt.IsZero() || got.Scope != ScopeDevice {
		t.Fatalf("got %+v, %v", got, err)
	}
}

// TestIssuedAtMicroseconds: iat keeps the microsecond it was minted at, so
// that a token minted after a removal in the same second is not taken for
// one issued before it (the removal rule compares microseconds).
func TestIssuedAtMicroseconds(t *testing.T) {
	key := newKey(t)
	pub := []ed25519.PublicKey{key.Public().(ed25519.PublicKey)}
	removed := time.UnixMicro(1_800_000_000_250_000)
	for _, iat := range []time.Time{removed.Add(time.Microsecond), time.UnixMicro(1_800_000_000_000_001), time.UnixMicro(1_800_000_000_999_999)} {
		tok, err := Mint(key, Claims{Household: "h", Device: "d", Expires: iat.Add(time.Hour), IssuedAt: iat})
		if err != nil {
			t.Fatal(err)
		}
		got, err := Verify(tok, pub, iat)
		if err != nil {
			t.Fatal(err)
		}
		if !got.IssuedAt.Equal(iat) {
			t.Fatalf("iat %v read back as %v", iat, got.IssuedAt)
		}
	}
	// Other issuers' spellings: an exponent is read to the second, a
	// fraction finer than microseconds is truncated.
	for raw, want := range map[string]time.Time{
		"1.8e9":              time.Unix(1_800_000_000, 0),
		"1800000000.1234567": time.UnixMicro(1_800_000_000_123_456),
		"1800000000.5":       time.UnixMicro(1_800_000_000_500_000),
		"1800000000":         time.Unix(1_800_000_000, 0),
	} {
		n := json.Number(raw)
		got, err := numericDate(&n)
		if err != nil || !got.Equal(want) {
			t.Errorf("numericDate(%s) = %v, %v; want %v", raw, got, err, want)
		}
	}
}

// FuzzVerify: no input makes Verify panic, and whatever it accepts was
// signed by the trusted key.
func FuzzVerify(f *testing.F) {
	key := ed25519.NewKeyFromSeed(make([]byte, 32))
	now := time.Unix(1_800_000_000, 0)
	tok, _ := Mint(key, Claims{Household: "h", Device: "d", Expires: now.Add(time.Hour), IssuedAt: now})
	f.Add(tok)
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	f.Add("a.b.c")
	f.Add(tok + "x")
	keys := []ed25519.PublicKey{key.Public().(ed25519.PublicKey)}
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := Verify(raw, keys, now)
		if err != nil {
			return
		}
		if c.Expires.IsZero() {
			t.Fatalf("accepted token without exp: %+v", c)
		}
		parts := strings.Split(raw, ".")
		sig, _ := b64.DecodeString(parts[2])
		if !ed25519.Verify(keys[0], []byte(parts[0]+"."+parts[1]), sig) {
			t.Fatal("accepted a token whose signature does not verify")
		}
	})
}

// TestInspect: Inspect shows what a token says whether or not it verifies,
// and refuses what does not decode.
func TestInspect(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	key := newKey(t)
	hdr := map[string]any{"alg": "EdDSA", "typ": "JWT", "kid": "2026-a"}
	claims := map[string]any{"hh": "home", "sub": "phone", "scope": "admin", "iat": now.Unix(), "exp": now.Add(-time.Hour).Unix()}
	// Expired and signed by a key nobody trusts: still readable.
	tok := forge(t, hdr, claims, func(b []byte) []byte { return ed25519.Sign(key, b) })
	if _, err := Verify(tok, nil, now); !errors.Is(err, ErrSignature) {
		t.Fatalf("Verify: %v, want ErrSignature", err)
	}
	h, c, err := Inspect(tok)
	if err != nil {
		t.Fatal(err)
	}
	want := Claims{Household: "home", Device: "phone", Scope: "admin", IssuedAt: now, Expires: now.Add(-time.Hour)}
	if h != (Header{Alg: "EdDSA", Typ: "JWT", Kid: "2026-a"}) || c != want {
		t.Fatalf("Inspect = %+v %+v, want kid 2026-a and %+v", h, c, want)
	}
	for _, bad := range []string{"", "a.b", "a.b.c.d", "!!.e30.x", tok[:strings.Index(tok, ".")] + ".!!.x", strings.Repeat("a", MaxLen+1)} {
		if _, _, err := Inspect(bad); !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrTooLong) {
			t.Errorf("Inspect(%.20q) = %v, want malformed", bad, err)
		}
	}
}
