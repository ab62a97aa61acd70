// Package token mints and verifies the relay's device tokens: compact JWTs
// (RFC 7519) signed with EdDSA over Ed25519 (RFC 8037). Only "EdDSA" is
// accepted, whatever the signature; the relay holds only public keys.
//
// It is meant for an app's own issuer (a relay whose FN_ISSUER_KEYS names
// the issuer's public key does not pair): [Mint] signs a device's [Claims];
// the relay checks them with [Verify].
package token

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/flamenet/relay/device"
)

// MaxLen is the longest token the relay parses; longer ones are refused
// before any decoding.
const MaxLen = 4096

// Skew is the clock skew allowed on exp and nbf.
const Skew = 60 * time.Second

// Scopes.
const (
	ScopeDevice = "device"
	ScopeAdmin  = "admin"
)

// Reasons a token is refused. The client always gets the same 401; these go
// to the log.
var (
	ErrTooLong      = errors.New("token: longer than 4 KiB")
	ErrMalformed    = errors.New("token: malformed")
	ErrAlgorithm    = errors.New("token: algorithm is not EdDSA")
	ErrSignature    = errors.New("token: signature does not verify with any trusted key")
	ErrClaims       = errors.New("token: missing or invalid claims")
	ErrExpired      = errors.New("token: expired")
	ErrNotYetValid  = errors.New("token: not yet valid")
	ErrFutureIssue  = errors.New("token: issued in the future")
	ErrUnknownScope = errors.New("token: unknown scope")
)

// Claims are the token's claims. Expires and NotBefore are whole Unix
// seconds; IssuedAt is kept to the microsecond, as removals are (a token
// minted in the second of its device's removal, but after it, is not one
// issued before it). IssuedAt and NotBefore are zero when absent.
type Claims struct {
	Household string
	Device    string
	Expires   time.Time
	IssuedAt  time.Time
	NotBefore time.Time
	Scope     string // ScopeDevice or ScopeAdmin
}

// Key returns the device the token speaks for.
func (c *Claims) Key() device.Key { return device.KeyOf(c.Household, c.Device) }

type header struct {
	Alg  string   `json:"alg"`
	Typ  string   `json:"typ,omitempty"`
	Kid  string   `json:"kid,omitempty"`
	Crit []string `json:"crit,omitempty"`
}

// HH and Sub are pointers so that a missing claim (refused here) differs
// from an empty one (a bad name, which the caller answers with 400).
type wireClaims struct {
	HH    *string      `json:"hh"`
	Sub   *string      `json:"sub"`
	Exp   *json.Number `json:"exp"`
	Iat   *json.Number `json:"iat,omitempty"`
	Nbf   *json.Number `json:"nbf,omitempty"`
	Scope string       `json:"scope,omitempty"`
}

// b64 is strict: each part has exactly one accepted spelling (the spare
// bits of the last character must be zero), so a token cannot be varied
// without breaking it, and every spelling is not its own cache entry.
var b64 = base64.RawURLEncoding.Strict()

// Mint signs claims with key. A zero IssuedAt or NotBefore is left out.
func Mint(key ed25519.PrivateKey, c Claims) (string, error) {
	if c.Household == "" || c.Device == "" || c.Expires.IsZero() {
		return "", fmt.Errorf("%w: hh, sub and exp are required", ErrClaims)
	}
	w := wireClaims{HH: &c.Household, Sub: &c.Device, Exp: unix(c.Expires), Scope: c.Scope}
	if !c.IssuedAt.IsZero() {
		w.Iat = unixMicro(c.IssuedAt)
	}
	if !c.NotBefore.IsZero() {
		w.Nbf = unix(c.NotBefore)
	}
	hb, err := json.Marshal(header{Alg: "EdDSA", Typ: "JWT"})
	if err != nil {
		return "", err
	}
	cb, err := json.Marshal(w)
	if err != nil {
		return "", err
	}
	signing := b64.EncodeToString(hb) + "." + b64.EncodeToString(cb)
	return signing + "." + b64.EncodeToString(ed25519.Sign(key, []byte(signing))), nil
}

func unix(t time.Time) *json.Number {
	n := json.Number(fmt.Sprint(t.Unix()))
	return &n
}

// unixMicro returns t as a NumericDate with a fraction of microseconds, when t
// has one (RFC 7519 allows non-integer values).
func unixMicro(t time.Time) *json.Number {
	us := t.UnixMicro()
	if us%1e6 == 0 {
		return unix(t)
	}
	n := json.Number(fmt.Sprintf("%d.%06d", us/1e6, us%1e6))
	return &n
}

// Verify checks raw against the trusted keys at time now and returns its
// claims. Names in the claims are not validated here, and may be empty: a
// validly signed token with a bad name is the issuer's mistake, and the
// caller answers 400.
func Verify(raw string, keys []ed25519.PublicKey, now time.Time) (Claims, error) {
	if len(raw) > MaxLen {
		return Claims{}, ErrTooLong
	}
	h64, rest, ok := strings.Cut(raw, ".")
	if !ok {
		return Claims{}, ErrMalformed
	}
	c64, s64, ok := strings.Cut(rest, ".")
	if !ok || strings.Contains(s64, ".") {
		return Claims{}, ErrMalformed
	}
	var h header
	if err := decodeJSON(h64, &h); err != nil {
		return Claims{}, err
	}
	// Checked before the signature: a token naming another algorithm is
	// refused whatever it carries.
	if h.Alg != "EdDSA" {
		return Claims{}, fmt.Errorf("%w: %q", ErrAlgorithm, h.Alg)
	}
	if len(h.Crit) > 0 {
		return Claims{}, fmt.Errorf("%w: unsupported crit header", ErrMalformed)
	}
	sig, err := b64.DecodeString(s64)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return Claims{}, fmt.Errorf("%w: signature encoding", ErrMalformed)
	}
	signing := []byte(raw[:len(h64)+1+len(c64)])
	verified := false
	for _, k := range keys {
		if ed25519.Verify(k, signing, sig) {
			verified = true
			break
		}
	}
	if !verified {
		return Claims{}, ErrSignature
	}
	var w wireClaims
	if err := decodeJSON(c64, &w); err != nil {
		return Claims{}, err
	}
	return w.claims(now)
}

// Header is a token's JOSE header, as Inspect shows it.
type Header struct {
	Alg string
	Typ string
	Kid string // the relay ignores it: every trusted key is tried
}

// Inspect decodes raw's header and claims without verifying anything, for
// tools that show an operator what a token says; only Verify says whether
// the relay accepts it. Claims that are absent or unreadable are left zero,
// and an empty Scope means none was given.
func Inspect(raw string) (Header, Claims, error) {
	if len(raw) > MaxLen {
		return Header{}, Claims{}, ErrTooLong
	}
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		return Header{}, Claims{}, ErrMalformed
	}
	var h header
	if err := decodeJSON(parts[0], &h); err != nil {
		return Header{}, Claims{}, err
	}
	hdr := Header{Alg: h.Alg, Typ: h.Typ, Kid: h.Kid}
	var w wireClaims
	if err := decodeJSON(parts[1], &w); err != nil {
		return hdr, Claims{}, err
	}
	var c Claims
	if w.HH != nil {
		c.Household = *w.HH
	}
	if w.Sub != nil {
		c.Device = *w.Sub
	}
	c.Scope = w.Scope
	c.Expires, _ = numericDate(w.Exp)
	c.IssuedAt, _ = numericDate(w.Iat)
	c.NotBefore, _ = numericDate(w.Nbf)
	return hdr, c, nil
}

func (w wireClaims) claims(now time.Time) (Claims, error) {
	if w.HH == nil || w.Sub == nil || w.Exp == nil {
		return Claims{}, fmt.Errorf("%w: hh, sub and exp are required", ErrClaims)
	}
	c := Claims{Household: *w.HH, Device: *w.Sub, Scope: w.Scope}
	var err error
	if c.Expires, err = numericDate(w.Exp); err != nil {
		return Claims{}, err
	}
	if c.IssuedAt, err = numericDate(w.Iat); err != nil {
		return Claims{}, err
	}
	if c.NotBefore, err = numericDate(w.Nbf); err != nil {
		return Claims{}, err
	}
	switch c.Scope {
	case "":
		c.Scope = ScopeDevice
	case ScopeDevice, ScopeAdmin:
	default:
		return Claims{}, fmt.Errorf("%w: %q", ErrUnknownScope, c.Scope)
	}
	if now.After(c.Expires.Add(Skew)) {
		return Claims{}, ErrExpired
	}
	if !c.NotBefore.IsZero() && now.Before(c.NotBefore.Add(-Skew)) {
		return Claims{}, ErrNotYetValid
	}
	// A future iat would outlive the device's removal: tokens issued at
	// or before a removal are refused, and this one would seem issued
	// after any removal to come.
	if !c.IssuedAt.IsZero() && now.Before(c.IssuedAt.Add(-Skew)) {
		return Claims{}, ErrFutureIssue
	}
	return c, nil
}

// numericDate reads an RFC 7519 NumericDate; a decimal fraction is kept to
// the microsecond (read from its digits, not through a float, so that a
// time minted to the microsecond reads back equal), other fractions are
// truncated to the second.
func numericDate(n *json.Number) (time.Time, error) {
	if n == nil {
		return time.Time{}, nil
	}
	f, err := n.Float64()
	if err != nil || f < 0 || f > math.MaxInt32*64 {
		return time.Time{}, fmt.Errorf("%w: bad NumericDate %q", ErrClaims, n.String())
	}
	whole, frac, ok := strings.Cut(n.String(), ".")
	if !ok || strings.ContainsAny(frac, "eE") {
		return time.Unix(int64(f), 0), nil
	}
	sec, err := strconv.ParseInt(whole, 10, 64)
	if err != nil {
		return time.Unix(int64(f), 0), nil
	}
	frac = (frac + "000000")[:6]
	us, err := strconv.ParseInt(frac, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: bad NumericDate %q", ErrClaims, n.String())
	}
	return time.UnixMicro(sec*1e6 + us), nil
}

func decodeJSON(part string, v any) error {
	b, err := b64.DecodeString(part)
	if err != nil {
		return fmt.Errorf("%w: base64: %v", ErrMalformed, err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("%w: json: %v", ErrMalformed, err)
	}
	if d.More() {
		return fmt.Errorf("%w: trailing data", ErrMalformed)
	}
	return nil
}
