package relay

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/accesslog"
	"github.com/flamenet/relay/internal/buckets"
	"github.com/flamenet/relay/internal/edkey"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/token"
)

// Pairing (docs/PROTOCOL.md "Pairing"): an admin asks for an invitation
// code for a device name, the new device redeems it for an access token
// and a renewal secret, and exchanges the renewal secret for fresh ones
// before the token expires. The relay mints the tokens with its issuer
// key, so all of this is off (404) when tokens come from another issuer.

// Pairing's defaults, used where Config leaves a field zero.
const (
	defaultInviteTTL      = 10 * time.Minute
	defaultAccessTokenTTL = time.Hour
	defaultRenewalTTL     = 90 * 24 * time.Hour
	defaultPairPerAddress = 10 // a minute
	defaultPairRate       = 100

	// renewGrace is how long after a renewal the same secret is taken for
	// a client retrying a lost answer.
	renewGrace = 30 * time.Second
	// pairBodyLimit bounds the bodies of pair, renew and invitations.
	pairBodyLimit = 1 << 10
)

// Which limit refused a pair or renew, in the error body's "limit" field.
const (
	limitPairAddress = "pair_address_rate"
	limitPairRate    = "pair_rate"
)

// pairing is the pairing endpoints' state; key nil: pairing is off.
type pairing struct {
	key       ed25519.PrivateKey
	addresses *buckets.Buckets[string]
	all       *rate.Limiter
}

// errPairRefused is the one answer to every code or secret refused,
// whatever the reason, which only the log tells.
var errPairRefused = &httpError{Status: http.StatusUnauthorized, Code: codeUnauthorized, Message: "The code or renewal secret is not valid."}

var errPairingOff = errorf(http.StatusNotFound, codeNotFound, "No such endpoint.")

func (s *Server) initPairing() {
	c := &s.cfg
	if c.InviteTTL <= 0 {
		c.InviteTTL = defaultInviteTTL
	}
	if c.AccessTokenTTL <= 0 {
		c.AccessTokenTTL = defaultAccessTokenTTL
	}
	if c.RenewalTTL <= 0 {
		c.RenewalTTL = defaultRenewalTTL
	}
	if c.PairRatePerAddress <= 0 {
		c.PairRatePerAddress = defaultPairPerAddress
	}
	if c.PairRate <= 0 {
		c.PairRate = defaultPairRate
	}
	s.pairing = pairing{
		key:       c.IssuerKey,
		addresses: buckets.New[string](float64(c.PairRatePerAddress)/60, c.PairRatePerAddress),
		all:       rate.NewLimiter(rate.Limit(float64(c.PairRate)/60), c.PairRate),
	}
}

// pairingOn answers 404 before anything else when the relay mints no
// tokens.
func (s *Server) pairingOn(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.pairing.key == nil {
			s.writeError(w, r, errPairingOff)
			return
		}
		h(w, r)
	}
}

// unauthed runs a handler that takes no token (pair, renew) behind the
// attempt limits, with a store deadline, and writes its error.
func (s *Server) unauthed(h func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return s.pairingOn(func(w http.ResponseWriter, r *http.Request) {
		startStoreBudget(r.Context(), s.cfg.StoreTimeout)
		err := s.admitPairing(r)
		if err == nil {
			err = h(w, r)
		}
		if err != nil {
			s.writeError(w, r, err)
		}
	})
}

// admitPairing takes a token from the client address's bucket, then from
// the relay's: one address's guessing spends its own tokens first.
func (s *Server) admitPairing(r *http.Request) error {
	now := s.now()
	addr := accesslog.ClientAddr(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), s.cfg.TrustedProxies)
	if ok, wait := s.pairing.addresses.Take(addr, now); !ok {
		he := rateLimited(limitPairAddress, "Too many attempts from this address; try again later.")
		he.RetryAfter = wait
		return he
	}
	if ok, wait := buckets.TakeAt(s.pairing.all, now); !ok {
		he := rateLimited(limitPairRate, "Too many attempts; try again later.")
		he.RetryAfter = wait
		return he
	}
	return nil
}

// refusePairing logs why a code or secret was refused and answers the
// same 401 whatever the reason. Attempts are rate-limited, so each gets
// its line.
func (s *Server) refusePairing(r *http.Request, reason string) error {
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "pairing refused", slog.String("path", r.URL.Path), slog.String("reason", reason),
		slog.String("client", accesslog.ClientAddr(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), s.cfg.TrustedProxies)))
	return errPairRefused
}

// refusal answers a store's refusal with errPairRefused, and passes any
// other error on.
func (s *Server) refusal(r *http.Request, err error) error {
	var re *store.RefusedError
	if errors.As(err, &re) {
		return s.refusePairing(r, re.Reason)
	}
	return err
}

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

// newRenewalSecret is "fnr1." and 32 random bytes in unpadded base64url.
func newRenewalSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return renewalPrefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// validRenewalSecret says whether s has a renewal secret's one spelling.
func validRenewalSecret(s string) bool {
	rest, ok := strings.CutPrefix(s, renewalPrefix)
	if !ok || len(rest) != 43 {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	return err == nil && len(b) == 32
}

type invitationRequest struct {
	Device string `json:"device" msgpack:"device"`
	Scope  string `json:"scope" msgpack:"scope"`
}

type invitationResponse struct {
	Code      string `json:"code" msgpack:"code"`
	URL       string `json:"url" msgpack:"url"`
	Household string `json:"household" msgpack:"household"`
	Device    string `json:"device" msgpack:"device"`
	Scope     string `json:"scope" msgpack:"scope"`
	ExpiresAt string `json:"expires_at" msgpack:"expires_at"`
}

func requireAdmin(c *token.Claims, what string) error {
	if c.Scope != token.ScopeAdmin {
		return errorf(http.StatusForbidden, codeForbidden, "Only an admin token may %s.", what)
	}
	return nil
}

func (s *Server) createInvitation(w http.ResponseWriter, r *http.Request, c *token.Claims) error {
	if err := requireAdmin(c, "invite devices"); err != nil {
		return err
	}
	body, err := readBody(w, r, pairBodyLimit)
	if err != nil {
		return err
	}
	var req invitationRequest
	if err := decodeRequest(r, body, &req); err != nil {
		return err
	}
	if !device.ValidName(req.Device) {
		return badRequest("device must be 1 to 64 characters of A-Z a-z 0-9 . _ -.")
	}
	switch req.Scope {
	case "":
		req.Scope = token.ScopeDevice
	case token.ScopeDevice, token.ScopeAdmin:
	default:
		return badRequest("scope must be device or admin.")
	}
	code := newCode()
	norm, _ := normalizeCode(code)
	now := s.now().UTC().Truncate(time.Microsecond)
	expires := now.Add(s.cfg.InviteTTL)
	ctx, cancel := s.storeCtx(r.Context())
	defer cancel()
	err = s.store.CreateInvitation(ctx, store.InviteParams{Household: c.Household, Device: req.Device, Scope: req.Scope,
		Code: store.HashSecret(norm), Now: now, Expires: expires})
	if err != nil {
		return err
	}
	writeBody(w, r, http.StatusCreated, invitationResponse{
		Code: code, URL: s.publicBase(r) + "/console/#pair=" + code,
		Household: c.Household, Device: req.Device, Scope: req.Scope, ExpiresAt: timestamp(expires),
	})
	return nil
}

// publicBase is the relay's base URL as its clients reach it:
// FN_PUBLIC_URL, or the request's Host with https when the request came
// over TLS or a trusted proxy says it did.
func (s *Server) publicBase(r *http.Request) string {
	if s.cfg.PublicURL != "" {
		return s.cfg.PublicURL
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	} else if s.fromTrustedProxy(r) {
		first, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
		if p := strings.ToLower(strings.TrimSpace(first)); p == "http" || p == "https" {
			scheme = p
		}
	}
	return (&url.URL{Scheme: scheme, Host: r.Host}).String()
}

func (s *Server) fromTrustedProxy(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

type invitationJSON struct {
	Device      string  `json:"device" msgpack:"device"`
	Scope       string  `json:"scope" msgpack:"scope"`
	ExpiresAt   string  `json:"expires_at" msgpack:"expires_at"`
	RedeemedAt  *string `json:"redeemed_at" msgpack:"redeemed_at"`
	IdentityKey []byte  `json:"identity_key" msgpack:"identity_key"`
}

type invitationsResponse struct {
	Invitations []invitationJSON `json:"invitations" msgpack:"invitations"`
}

func (s *Server) listInvitations(w http.ResponseWriter, r *http.Request, c *token.Claims) error {
	if err := requireAdmin(c, "list invitations"); err != nil {
		return err
	}
	now := s.now()
	ctx, cancel := s.storeCtx(r.Context())
	defer cancel()
	ins, err := s.store.Invitations(ctx, store.InvitationsParams{Household: c.Household, Now: now, RedeemedSince: now.Add(-store.InvitationsKept)})
	if err != nil {
		return err
	}
	out := invitationsResponse{Invitations: make([]invitationJSON, 0, len(ins))}
	for _, in := range ins {
		j := invitationJSON{Device: in.Device, Scope: in.Scope, ExpiresAt: timestamp(in.ExpiresAt)}
		if !in.RedeemedAt.IsZero() {
			at := timestamp(in.RedeemedAt)
			j.RedeemedAt = &at
		}
		if len(in.IdentityKey) > 0 {
			j.IdentityKey = in.IdentityKey
		}
		out.Invitations = append(out.Invitations, j)
	}
	writeBody(w, r, http.StatusOK, out)
	return nil
}

type pairRequest struct {
	Code        *string `json:"code" msgpack:"code"`
	IdentityKey *[]byte `json:"identity_key" msgpack:"identity_key"`
}

type renewRequest struct {
	RenewalSecret *string `json:"renewal_secret" msgpack:"renewal_secret"`
}

// credentialsResponse answers pair and renew.
type credentialsResponse struct {
	Household        string `json:"household" msgpack:"household"`
	Device           string `json:"device" msgpack:"device"`
	Scope            string `json:"scope" msgpack:"scope"`
	AccessToken      string `json:"access_token" msgpack:"access_token"`
	AccessExpiresAt  string `json:"access_expires_at" msgpack:"access_expires_at"`
	RenewalSecret    string `json:"renewal_secret" msgpack:"renewal_secret"`
	RenewalExpiresAt string `json:"renewal_expires_at" msgpack:"renewal_expires_at"`
}

func (s *Server) pair(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, pairBodyLimit)
	if err != nil {
		return err
	}
	var req pairRequest
	if err := decodeRequest(r, body, &req); err != nil {
		return err
	}
	if req.Code == nil {
		return badRequest("code is required.")
	}
	var key []byte
	if req.IdentityKey != nil {
		if err := edkey.Check(*req.IdentityKey); err != nil {
			return badRequest("identity_key must be a valid 32-byte Ed25519 public key that is not of small order.")
		}
		key = *req.IdentityKey
	}
	code, ok := normalizeCode(*req.Code)
	if !ok {
		return s.refusePairing(r, "malformed")
	}
	secret := newRenewalSecret()
	now := s.now().UTC().Truncate(time.Microsecond)
	p := store.PairParams{Code: store.HashSecret(code), IdentityKey: key, Now: now,
		Secret: store.HashSecret(secret), SecretExpires: now.Add(s.cfg.RenewalTTL)}
	ctx, cancel := s.storeCtx(r.Context())
	defer cancel()
	g, err := s.memory.Pair(ctx, p)
	if err != nil {
		return s.refusal(r, err)
	}
	noteDevice(r.Context(), g.Household, g.Device)
	return s.grant(w, r, g, now, secret, p.SecretExpires)
}

func (s *Server) renew(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, pairBodyLimit)
	if err != nil {
		return err
	}
	var req renewRequest
	if err := decodeRequest(r, body, &req); err != nil {
		return err
	}
	if req.RenewalSecret == nil {
		return badRequest("renewal_secret is required.")
	}
	if !validRenewalSecret(*req.RenewalSecret) {
		return s.refusePairing(r, "malformed")
	}
	next := newRenewalSecret()
	now := s.now().UTC().Truncate(time.Microsecond)
	p := store.RenewParams{Secret: store.HashSecret(*req.RenewalSecret), NewSecret: store.HashSecret(next), Now: now,
		SecretExpires: now.Add(s.cfg.RenewalTTL), Grace: renewGrace}
	ctx, cancel := s.storeCtx(r.Context())
	defer cancel()
	g, err := s.store.Renew(ctx, p)
	if err != nil {
		return s.refusal(r, err)
	}
	noteDevice(r.Context(), g.Household, g.Device)
	return s.grant(w, r, g, now, next, p.SecretExpires)
}

// grant mints g's access token, issued at now, and answers with it and
// the renewal secret the store now holds.
func (s *Server) grant(w http.ResponseWriter, r *http.Request, g store.Grant, now time.Time, secret string, secretExpires time.Time) error {
	// Whole seconds, as the token carries them.
	iat := now.Truncate(time.Second)
	exp := iat.Add(s.cfg.AccessTokenTTL)
	tok, err := token.Mint(s.pairing.key, token.Claims{Household: g.Household, Device: g.Device, Scope: g.Scope, IssuedAt: iat, Expires: exp})
	if err != nil {
		return err
	}
	writeBody(w, r, http.StatusOK, credentialsResponse{
		Household: g.Household, Device: g.Device, Scope: g.Scope,
		AccessToken: tok, AccessExpiresAt: timestamp(exp),
		RenewalSecret: secret, RenewalExpiresAt: timestamp(secretExpires),
	})
	return nil
}
