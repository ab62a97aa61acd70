// Package pairing pairs devices (docs/PROTOCOL.md "Pairing"): an admin asks
// for an invitation code for a device name, the new device redeems it for
// an access token and a renewal secret, and exchanges the renewal secret
// for fresh ones before the token expires. The relay mints the tokens with
// its issuer key, so all of this is off (404) when tokens come from
// another issuer.
//
// The handlers of /v1/invitations, /v1/pair and /v1/renew are here; the
// relay routes them, checks the admin's token, and lends them its answers'
// deadlines, its store deadline and its access log (API).
package pairing

import (
	"context"
	"crypto/ed25519"
	"errors"
	"log/slog"
	"mime"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/time/rate"

	"github.com/flamenet/relay/internal/accesslog"
	"github.com/flamenet/relay/internal/buckets"
	"github.com/flamenet/relay/internal/cors"
	"github.com/flamenet/relay/internal/wire"
	"github.com/flamenet/relay/store"
)

// Config is how the relay pairs; a field left zero takes its default.
type Config struct {
	// Key is the issuer's private key the relay mints tokens with; nil:
	// pairing is off.
	Key ed25519.PrivateKey
	// InviteTTL, AccessTokenTTL and RenewalTTL are the lifetimes of an
	// invitation, a minted access token and a renewal secret.
	InviteTTL      time.Duration
	AccessTokenTTL time.Duration
	RenewalTTL     time.Duration
	// PublicURL is the base of invitation links; empty: from the request.
	PublicURL string
	// PerAddress and Rate are pair and renew attempts a minute (and the
	// burst), from one client address and in all.
	PerAddress int
	Rate       int
	// TrustedProxies are the peers whose X-Forwarded-For and
	// X-Forwarded-Proto are believed.
	TrustedProxies []netip.Prefix
	// Origins are the web origins other than the relay's own whose pages
	// may pair and renew (FN_CORS_ORIGINS; "*" allows none of them here).
	Origins []string
}

// Defaults, used where Config leaves a field zero.
const (
	defaultInviteTTL      = 10 * time.Minute
	defaultAccessTokenTTL = time.Hour
	defaultRenewalTTL     = 90 * 24 * time.Hour
	defaultPerAddress     = 10 // a minute
	defaultRate           = 100

	// renewGrace is how long after a renewal the same secret is taken for
	// a client retrying a lost answer.
	renewGrace = 30 * time.Second
	// bodyLimit bounds the bodies of pair, renew and invitations.
	bodyLimit = 1 << 10
	// perSecret is the renewals a minute (and the burst) of one vouched
	// renewal secret: a device renews about once an hour, and retries.
	perSecret = 6
)

// Which limit refused a pair or renew, in the error body's "limit" field.
const (
	LimitAddress = "pair_address_rate"
	LimitRate    = "pair_rate"
	LimitSecret  = "renewal_secret_rate"
)

// API is what the handlers take from the server that routes them, so that
// pairing's answers are the API's like any other.
type API interface {
	// Write answers with v, encoded as the client asked.
	Write(w http.ResponseWriter, r *http.Request, status int, v any)
	// StoreContext bounds a store call by the request's store deadline.
	StoreContext(ctx context.Context) (context.Context, context.CancelFunc)
	// NoteDevice names, for the access log, the device a request paired or
	// renewed.
	NoteDevice(ctx context.Context, household, device string)
}

// Pairing serves the pairing endpoints.
type Pairing struct {
	cfg   Config
	store store.Pairing
	api   API
	log   *slog.Logger
	now   func() time.Time

	keys      keys
	addresses *buckets.Buckets[string]
	all       *rate.Limiter
	secrets   *buckets.Buckets[store.SecretHash]
}

// New is pairing as cfg says, on st, answering through api. st's Pair must
// also tell the relay's memory of the device it registers.
func New(cfg Config, st store.Pairing, api API, log *slog.Logger, now func() time.Time) *Pairing {
	if cfg.InviteTTL <= 0 {
		cfg.InviteTTL = defaultInviteTTL
	}
	if cfg.AccessTokenTTL <= 0 {
		cfg.AccessTokenTTL = defaultAccessTokenTTL
	}
	if cfg.RenewalTTL <= 0 {
		cfg.RenewalTTL = defaultRenewalTTL
	}
	if cfg.PerAddress <= 0 {
		cfg.PerAddress = defaultPerAddress
	}
	if cfg.Rate <= 0 {
		cfg.Rate = defaultRate
	}
	p := &Pairing{
		cfg: cfg, store: st, api: api, log: log, now: now,
		addresses: buckets.New[string](float64(cfg.PerAddress)/60, cfg.PerAddress),
		all:       rate.NewLimiter(rate.Limit(float64(cfg.Rate)/60), cfg.Rate),
		secrets:   buckets.New[store.SecretHash](float64(perSecret)/60, perSecret),
	}
	if cfg.Key != nil {
		p.keys = deriveKeys(cfg.Key)
	}
	return p
}

// On says whether the relay pairs: whether it mints tokens.
func (p *Pairing) On() bool { return p != nil && p.cfg.Key != nil }

// errRefused is the one answer to every code or secret refused, whatever
// the reason, which only the log tells.
var errRefused = &wire.Error{Status: http.StatusUnauthorized, Message: "The code or renewal secret is not valid."}

// browserGuard refuses, before any budget is spent, what a web page can
// send on its visitor's behalf without asking the relay first: a body
// that is not JSON or MessagePack (a text/plain POST needs no CORS
// preflight), and a request from an origin that may not pair. A request
// without an Origin is no browser's.
func (p *Pairing) browserGuard(r *http.Request) error {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case err != nil, mt != wire.ContentJSON && mt != wire.ContentMsgpack && mt != "application/x-msgpack":
		return wire.Errorf(http.StatusUnsupportedMediaType, "The body must be %s or %s.", wire.ContentJSON, wire.ContentMsgpack)
	}
	if o := r.Header.Get("Origin"); o != "" && !cors.SameOrigin(o, r.Host) && !slices.Contains(p.cfg.Origins, o) {
		return wire.Errorf(http.StatusForbidden, "Pages from %s may not pair or renew: FN_CORS_ORIGINS does not list that origin.", o)
	}
	return nil
}

// admitSecret takes a token from a vouched secret's own bucket: a device
// renewing never waits on guesses, whoever makes them.
func (p *Pairing) admitSecret(h store.SecretHash) error {
	if ok, wait := p.secrets.Take(h, p.now()); !ok {
		return &wire.Error{Status: http.StatusTooManyRequests, Limit: LimitSecret, RetryAfter: wait,
			Message: "Too many renewals of this secret; try again later."}
	}
	return nil
}

// admit takes a token from the client address's bucket, then from the
// relay's: one address's guessing spends its own tokens first.
func (p *Pairing) admit(r *http.Request) error {
	now := p.now()
	if ok, wait := p.addresses.Take(p.client(r), now); !ok {
		return &wire.Error{Status: http.StatusTooManyRequests, Limit: LimitAddress, RetryAfter: wait,
			Message: "Too many attempts from this address; try again later."}
	}
	if ok, wait := buckets.TakeAt(p.all, now); !ok {
		return &wire.Error{Status: http.StatusTooManyRequests, Limit: LimitRate, RetryAfter: wait,
			Message: "Too many attempts; try again later."}
	}
	return nil
}

// client is the request's client address, behind trusted proxies.
func (p *Pairing) client(r *http.Request) string {
	return accesslog.ClientAddr(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), p.cfg.TrustedProxies)
}

// refuse logs why a code or secret was refused and answers the same 401
// whatever the reason. Attempts are rate-limited, so each gets its line.
func (p *Pairing) refuse(r *http.Request, reason string) error {
	p.log.LogAttrs(r.Context(), slog.LevelInfo, "pairing refused", slog.String("path", r.URL.Path), slog.String("reason", reason),
		slog.String("client", p.client(r)))
	return errRefused
}

// refusal answers a store's refusal with errRefused, and passes any other
// error on.
func (p *Pairing) refusal(r *http.Request, err error) error {
	var re *store.RefusedError
	if errors.As(err, &re) {
		return p.refuse(r, re.Reason)
	}
	return err
}
