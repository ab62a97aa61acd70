package webpush

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"
)

// VAPIDLife is how long a VAPID token lives: RFC 8292 allows at most 24
// hours, push services often less; one is signed per push service origin
// and reused for half its life.
const VAPIDLife = 12 * time.Hour

// VAPID identifies the relay to push services (RFC 8292): a P-256 key
// pair whose public key browsers are given as applicationServerKey, and
// a contact for the push service's operators.
type VAPID struct {
	key     *ecdsa.PrivateKey
	public  string // the uncompressed public key, base64url
	subject string

	mu     sync.Mutex
	tokens map[string]signed // by audience
}

type signed struct {
	token  string
	expiry time.Time
}

// NewVAPID returns the VAPID identity of key with contact subject, which must
// be a mailto: or https: URI (Apple's service takes nothing else).
func NewVAPID(key *ecdsa.PrivateKey, subject string) (*VAPID, error) {
	if key == nil || key.Curve != elliptic.P256() {
		return nil, errors.New("webpush: a VAPID key is a P-256 key")
	}
	if err := CheckSubject(subject); err != nil {
		return nil, err
	}
	pub, err := key.PublicKey.Bytes()
	if err != nil {
		return nil, err
	}
	return &VAPID{key: key, public: base64.RawURLEncoding.EncodeToString(pub), subject: subject, tokens: map[string]signed{}}, nil
}

// CheckSubject says whether s can be a VAPID sub: a mailto: address or an
// https: URL.
func CheckSubject(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("webpush: VAPID subject %q: %w", s, err)
	case u.Scheme == "mailto" && strings.Contains(u.Opaque, "@"):
		return nil
	case u.Scheme == "https" && u.Host != "":
		return nil
	}
	return fmt.Errorf("webpush: VAPID subject %q: want mailto:someone@example.com or an https:// URL", s)
}

// PublicKey returns the VAPID public key as browsers take it for
// applicationServerKey: the uncompressed point in unpadded base64url.
func (v *VAPID) PublicKey() string { return v.public }

// Subject returns the contact the tokens carry.
func (v *VAPID) Subject() string { return v.subject }

// Authorization returns the Authorization header of a push to endpoint at
// now: "vapid t=<JWT>, k=<public key>" (RFC 8292 section 3), the JWT's aud
// the endpoint's origin.
func (v *VAPID) Authorization(endpoint string, now time.Time) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return "", errors.New("webpush: the endpoint is not a URL")
	}
	aud := u.Scheme + "://" + u.Host
	v.mu.Lock()
	defer v.mu.Unlock()
	if s, ok := v.tokens[aud]; ok && now.Before(s.expiry.Add(-VAPIDLife/2)) {
		return "vapid t=" + s.token + ", k=" + v.public, nil
	}
	exp := now.Add(VAPIDLife).Truncate(time.Second)
	tok, err := v.sign(aud, exp)
	if err != nil {
		return "", err
	}
	if len(v.tokens) > 1024 { // push services are few; an unbounded map is not
		clear(v.tokens)
	}
	v.tokens[aud] = signed{token: tok, expiry: exp}
	return "vapid t=" + tok + ", k=" + v.public, nil
}

// sign returns the ES256 JWT of aud and exp.
func (v *VAPID) sign(aud string, exp time.Time) (string, error) {
	enc := base64.RawURLEncoding
	header, _ := json.Marshal(map[string]string{"typ": "JWT", "alg": "ES256"})
	claims, err := json.Marshal(map[string]any{"aud": aud, "exp": exp.Unix(), "sub": v.subject})
	if err != nil {
		return "", err
	}
	input := enc.EncodeToString(header) + "." + enc.EncodeToString(claims)
	digest := sha256.Sum256([]byte(input))
	r, s, err := ecdsa.Sign(rand.Reader, v.key, digest[:])
	if err != nil {
		return "", err
	}
	// JWS: r and s as two 32-byte big-endian integers (RFC 7518 3.4).
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return input + "." + enc.EncodeToString(sig), nil
}

// GenerateVAPIDKey returns a fresh P-256 key.
func GenerateVAPIDKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

// ParseVAPIDKey reads a VAPID private key as web-push tools write it: the
// 32-byte scalar in base64url (padded or not), or standard base64.
func ParseVAPIDKey(s string) (*ecdsa.PrivateKey, error) {
	s = strings.TrimSpace(s)
	var b []byte
	var err error
	for _, enc := range []*base64.Encoding{base64.RawURLEncoding, base64.URLEncoding, base64.StdEncoding, base64.RawStdEncoding} {
		if b, err = enc.DecodeString(s); err == nil {
			break
		}
	}
	if err != nil || len(b) != 32 {
		return nil, errors.New("webpush: a VAPID private key is 32 bytes in base64url")
	}
	return ecdsa.ParseRawPrivateKey(elliptic.P256(), b)
}

// FormatVAPIDKey returns key as ParseVAPIDKey reads it.
func FormatVAPIDKey(key *ecdsa.PrivateKey) (string, error) {
	b, err := key.Bytes()
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
