package pairing

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/edkey"
	"github.com/flamenet/relay/internal/wire"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/token"
)

type invitationRequest struct {
	Device string `json:"device" msgpack:"device"`
	Scope  string `json:"scope" msgpack:"scope"`
	// Replace: the device may exist, and pairing removes it first.
	Replace bool `json:"replace" msgpack:"replace"`
}

// InvitationResponse answers POST /v1/invitations.
type InvitationResponse struct {
	Code      string `json:"code" msgpack:"code"`
	URL       string `json:"url" msgpack:"url"`
	Household string `json:"household" msgpack:"household"`
	Device    string `json:"device" msgpack:"device"`
	Scope     string `json:"scope" msgpack:"scope"`
	Replace   bool   `json:"replace" msgpack:"replace"`
	ExpiresAt string `json:"expires_at" msgpack:"expires_at"`
}

// read decodes the request's body, at most bodyLimit bytes, into v.
func read(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := wire.ReadBody(w, r, bodyLimit)
	if err != nil {
		return err
	}
	return wire.DecodeRequest(r, body, v)
}

func badRequest(msg string) error { return &wire.Error{Status: http.StatusBadRequest, Message: msg} }

func requireAdmin(c *token.Claims, what string) error {
	if c.Scope != token.ScopeAdmin {
		return wire.Errorf(http.StatusForbidden, "Only an admin token may %s.", what)
	}
	return nil
}

// CreateInvitation serves POST /v1/invitations: an admin's invitation for
// a device name, as a code and a link.
func (p *Pairing) CreateInvitation(w http.ResponseWriter, r *http.Request, c *token.Claims) error {
	if err := requireAdmin(c, "invite devices"); err != nil {
		return err
	}
	var req invitationRequest
	if err := read(w, r, &req); err != nil {
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
	now := p.now().UTC().Truncate(time.Microsecond)
	expires := now.Add(p.cfg.InviteTTL)
	ctx, cancel := p.api.StoreContext(r.Context())
	defer cancel()
	err := p.store.CreateInvitation(ctx, store.InviteParams{Household: c.Household, Device: req.Device, Scope: req.Scope,
		Code: p.keys.hashCode(norm), Now: now, Expires: expires, Replace: req.Replace, CreatedBy: c.Device})
	if errors.Is(err, store.ErrDeviceExists) {
		return wire.Errorf(http.StatusConflict, "Device %q exists. An invitation for it must replace it (\"replace\": true): "+
			"pairing then removes it, its envelopes and its credentials.", req.Device)
	}
	if err != nil {
		return err
	}
	p.api.Write(w, r, http.StatusCreated, InvitationResponse{
		Code: code, URL: p.link(r, c.Household, norm, req.Scope),
		Household: c.Household, Device: req.Device, Scope: req.Scope, Replace: req.Replace, ExpiresAt: wire.Timestamp(expires),
	})
	return nil
}

// CancelInvitation serves DELETE /v1/invitations/{device}: an admin
// cancels the device's pending invitation, whose code no longer pairs.
// The name is the route's {device} (the router sets the path value).
func (p *Pairing) CancelInvitation(w http.ResponseWriter, r *http.Request, c *token.Claims) error {
	name := r.PathValue("device")
	if err := requireAdmin(c, "cancel invitations"); err != nil {
		return err
	}
	if !device.ValidName(name) {
		return badRequest("The device name is not 1 to 64 characters of A-Z a-z 0-9 . _ -.")
	}
	ctx, cancel := p.api.StoreContext(r.Context())
	defer cancel()
	err := p.store.CancelInvitation(ctx, c.Household, name)
	if errors.Is(err, store.ErrNotFound) {
		return wire.Errorf(http.StatusNotFound, "Device %q has no pending invitation.", name)
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// link is the pairing link of a code (normalizeCode's spelling) of
// household's, for an invitation of scope. An admin's opens the console,
// which pairs the browser with it once asked; an app device's opens the
// pairing page (/pair/), which only shows the code and hands it to the
// app: a browser that spent it would be a device the console cannot use.
// The code is after the #, which browsers send to no server.
func (p *Pairing) link(r *http.Request, household, code, scope string) string {
	spelled := code[:codeLen/2] + "-" + code[codeLen/2:]
	if scope == token.ScopeAdmin {
		return p.publicBase(r) + "/console/#pair=" + spelled + "&household=" + url.QueryEscape(household) + "&scope=admin"
	}
	return p.publicBase(r) + "/pair/#code=" + spelled + "&household=" + url.QueryEscape(household)
}

// QRLink reads POST /console/qr's body, an invitation's code (never in
// the URL, so that no access log or proxy log holds it) and its scope
// (device when absent), for an admin token, and returns the code's
// pairing link: the one POST /v1/invitations answered for it. The code is
// not looked up, only read, and never logged; the scope is the admin's
// word, and only chooses which of the household's pages the link opens.
func (p *Pairing) QRLink(w http.ResponseWriter, r *http.Request, c *token.Claims) (string, error) {
	if err := requireAdmin(c, "ask for invitation QR codes"); err != nil {
		return "", err
	}
	var req struct {
		Code  string `json:"code" msgpack:"code"`
		Scope string `json:"scope" msgpack:"scope"`
	}
	if err := read(w, r, &req); err != nil {
		return "", err
	}
	code, ok := normalizeCode(req.Code)
	if !ok {
		return "", badRequest("code must be an invitation code (ABCDE-FGHJK).")
	}
	switch req.Scope {
	case "", token.ScopeDevice, token.ScopeAdmin:
	default:
		return "", badRequest("scope must be device or admin.")
	}
	return p.link(r, c.Household, code, req.Scope), nil
}

// publicBase is the relay's base URL as its clients reach it:
// FN_PUBLIC_URL, or the request's Host with https when the request came
// over TLS or a trusted proxy says it did.
func (p *Pairing) publicBase(r *http.Request) string {
	if p.cfg.PublicURL != "" {
		return p.cfg.PublicURL
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	} else if p.fromTrustedProxy(r) {
		first, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
		if s := strings.ToLower(strings.TrimSpace(first)); s == "http" || s == "https" {
			scheme = s
		}
	}
	return (&url.URL{Scheme: scheme, Host: r.Host}).String()
}

func (p *Pairing) fromTrustedProxy(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, pr := range p.cfg.TrustedProxies {
		if pr.Contains(a) {
			return true
		}
	}
	return false
}

// InvitationJSON is one invitation in GET /v1/invitations.
type InvitationJSON struct {
	Device      string  `json:"device" msgpack:"device"`
	Scope       string  `json:"scope" msgpack:"scope"`
	ExpiresAt   string  `json:"expires_at" msgpack:"expires_at"`
	RedeemedAt  *string `json:"redeemed_at" msgpack:"redeemed_at"`
	IdentityKey []byte  `json:"identity_key" msgpack:"identity_key"`
	Replace     bool    `json:"replace" msgpack:"replace"`
	CreatedBy   string  `json:"created_by" msgpack:"created_by"`
}

// InvitationsResponse answers GET /v1/invitations.
type InvitationsResponse struct {
	Invitations []InvitationJSON `json:"invitations" msgpack:"invitations"`
}

// ListInvitations serves GET /v1/invitations: the household's pending
// invitations and those redeemed lately, for an admin.
func (p *Pairing) ListInvitations(w http.ResponseWriter, r *http.Request, c *token.Claims) error {
	if err := requireAdmin(c, "list invitations"); err != nil {
		return err
	}
	now := p.now()
	ctx, cancel := p.api.StoreContext(r.Context())
	defer cancel()
	ins, err := p.store.Invitations(ctx, store.InvitationsParams{Household: c.Household, Now: now, RedeemedSince: now.Add(-store.InvitationsKept)})
	if err != nil {
		return err
	}
	out := InvitationsResponse{Invitations: make([]InvitationJSON, 0, len(ins))}
	for _, in := range ins {
		j := InvitationJSON{Device: in.Device, Scope: in.Scope, ExpiresAt: wire.Timestamp(in.ExpiresAt),
			Replace: in.Replace, CreatedBy: in.CreatedBy}
		if !in.RedeemedAt.IsZero() {
			at := wire.Timestamp(in.RedeemedAt)
			j.RedeemedAt = &at
		}
		if len(in.IdentityKey) > 0 {
			j.IdentityKey = in.IdentityKey
		}
		out.Invitations = append(out.Invitations, j)
	}
	p.api.Write(w, r, http.StatusOK, out)
	return nil
}

type pairRequest struct {
	Code        *string `json:"code" msgpack:"code"`
	IdentityKey *[]byte `json:"identity_key" msgpack:"identity_key"`
	// Scope, when set, is the only scope the caller can use: a code of
	// another is refused as any refused code is, and stays unspent.
	Scope *string `json:"scope" msgpack:"scope"`
}

type renewRequest struct {
	RenewalSecret *string `json:"renewal_secret" msgpack:"renewal_secret"`
}

// CredentialsResponse answers pair and renew.
type CredentialsResponse struct {
	Household        string `json:"household" msgpack:"household"`
	Device           string `json:"device" msgpack:"device"`
	Scope            string `json:"scope" msgpack:"scope"`
	AccessToken      string `json:"access_token" msgpack:"access_token"`
	AccessExpiresAt  string `json:"access_expires_at" msgpack:"access_expires_at"`
	RenewalSecret    string `json:"renewal_secret" msgpack:"renewal_secret"`
	RenewalExpiresAt string `json:"renewal_expires_at" msgpack:"renewal_expires_at"`
}

// Pair serves POST /v1/pair: a code redeemed for credentials, behind the
// attempt limits.
func (p *Pairing) Pair(w http.ResponseWriter, r *http.Request) error {
	if err := p.browserGuard(r); err != nil {
		return err
	}
	if err := p.admit(r); err != nil {
		return err
	}
	var req pairRequest
	if err := read(w, r, &req); err != nil {
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
	var scope string
	if req.Scope != nil {
		if scope = *req.Scope; scope != token.ScopeDevice && scope != token.ScopeAdmin {
			return badRequest("scope must be device or admin.")
		}
	}
	code, ok := normalizeCode(*req.Code)
	if !ok {
		return p.refuse(r, "malformed")
	}
	secret := p.keys.newSecret()
	now := p.now().UTC().Truncate(time.Microsecond)
	pp := store.PairParams{Code: p.keys.hashCode(code), IdentityKey: key, Now: now,
		Secret: store.HashSecret(secret), SecretExpires: now.Add(p.cfg.RenewalTTL), Scope: scope}
	ctx, cancel := p.api.StoreContext(r.Context())
	defer cancel()
	g, err := p.store.Pair(ctx, pp)
	if err != nil {
		return p.refusal(r, err)
	}
	p.api.NoteDevice(r.Context(), g.Household, g.Device)
	return p.grant(w, r, g, now, secret, pp.SecretExpires)
}

// Renew serves POST /v1/renew: a renewal secret exchanged for fresh
// credentials. A secret this relay tagged (vouched) has a budget of its
// own; any other, a guess or one of the first version, is behind the
// attempt limits. The body is read first to know which.
func (p *Pairing) Renew(w http.ResponseWriter, r *http.Request) error {
	if err := p.browserGuard(r); err != nil {
		return err
	}
	var req renewRequest
	if err := read(w, r, &req); err != nil {
		return err
	}
	if req.RenewalSecret != nil && p.keys.vouched(*req.RenewalSecret) {
		if err := p.admitSecret(store.HashSecret(*req.RenewalSecret)); err != nil {
			return err
		}
	} else if err := p.admit(r); err != nil {
		return err
	}
	if req.RenewalSecret == nil {
		return badRequest("renewal_secret is required.")
	}
	if !ValidRenewalSecret(*req.RenewalSecret) {
		return p.refuse(r, "malformed")
	}
	next := p.keys.newSecret()
	now := p.now().UTC().Truncate(time.Microsecond)
	rp := store.RenewParams{Secret: store.HashSecret(*req.RenewalSecret), NewSecret: store.HashSecret(next), Now: now,
		SecretExpires: now.Add(p.cfg.RenewalTTL), Grace: renewGrace}
	ctx, cancel := p.api.StoreContext(r.Context())
	defer cancel()
	g, err := p.store.Renew(ctx, rp)
	if err != nil {
		return p.refusal(r, err)
	}
	p.api.NoteDevice(r.Context(), g.Household, g.Device)
	return p.grant(w, r, g, now, next, rp.SecretExpires)
}

// grant mints g's access token, issued at now, and answers with it and
// the renewal secret the store now holds.
func (p *Pairing) grant(w http.ResponseWriter, r *http.Request, g store.Grant, now time.Time, secret string, secretExpires time.Time) error {
	// To the microsecond, as removals are kept, and after the device's
	// last removal even if that was recorded by a relay whose clock is
	// ahead: a token the relay mints is one it accepts.
	iat := store.IssuedAfter(now, g.RemovedAt)
	exp := iat.Add(p.cfg.AccessTokenTTL).Truncate(time.Second)
	tok, err := token.Mint(p.cfg.Key, token.Claims{Household: g.Household, Device: g.Device, Scope: g.Scope, IssuedAt: iat, Expires: exp})
	if err != nil {
		return err
	}
	p.api.Write(w, r, http.StatusOK, CredentialsResponse{
		Household: g.Household, Device: g.Device, Scope: g.Scope,
		AccessToken: tok, AccessExpiresAt: wire.Timestamp(exp),
		RenewalSecret: secret, RenewalExpiresAt: wire.Timestamp(secretExpires),
	})
	return nil
}
