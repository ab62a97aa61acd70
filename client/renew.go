package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// renewPause is how long after a renewal that failed for a passing reason
// (no answer, 429, 5xx) the next is tried, while the access token still
// works: not on every call in between.
const renewPause = 5 * time.Second

// RenewingOptions are a Renewing source's settings; the zero value is good.
type RenewingOptions struct {
	// HTTPClient makes the renewals (default: a client of its own; the
	// same origin-only redirect rule as the Client's applies).
	HTTPClient *http.Client
	// RequestTimeout bounds each renewal (default 30 s).
	RequestTimeout time.Duration
	// Now is the clock (default time.Now); tests drive it.
	Now func() time.Time
}

// Renewing is a credential source for a paired device: it holds the access
// token and renewal secret, renews them at POST /v1/renew when less than a
// third of the access token's life is left (or 5 minutes, whichever is
// less) and when the relay refuses the token, and saves each new set in
// its store before using it. Concurrent calls that find a renewal due make
// one renewal and all wait for it. Safe for concurrent use.
//
// When a renewal is refused (the secret was used elsewhere, expired, or
// the device was removed), every later call fails with an error wrapping
// ErrUnauthorized: the device must be paired again.
type Renewing struct {
	base    string
	store   CredentialStore
	hc      *http.Client
	timeout time.Duration
	now     func() time.Time

	mu   sync.Mutex
	cur  Credentials
	lead time.Duration // renew this long before cur's access expiry
	// obtained is when this process received cur, by its own clock, and
	// life the access token's life: a clock that is ahead of the relay's
	// would otherwise find every new token due at once and renew without
	// end. Zero for credentials loaded from the store.
	obtained time.Time
	life     time.Duration
	flight   *flight   // the renewal under way, or nil
	refused  error     // set once a renewal was refused: final
	lastErr  error     // the last renewal's passing failure
	retryAt  time.Time // no renewal before this, after a passing failure
}

// flight is one renewal that concurrent callers wait for.
type flight struct {
	done chan struct{}
	err  error
}

// NewRenewing makes a source of the credentials saved in store (as Pair
// saves them), renewing them at the relay at baseURL.
func NewRenewing(ctx context.Context, baseURL string, store CredentialStore, opts RenewingOptions) (*Renewing, error) {
	c, err := store.Load(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.valid(); err != nil {
		return nil, err
	}
	r := &Renewing{
		base:    strings.TrimRight(baseURL, "/"),
		store:   store,
		hc:      originOnly(opts.HTTPClient),
		timeout: opts.RequestTimeout,
		now:     opts.Now,
		cur:     c,
		lead:    renewLead(c),
	}
	if r.timeout <= 0 {
		r.timeout = DefaultRequestTimeout
	}
	if r.now == nil {
		r.now = time.Now
	}
	return r, nil
}

// Credentials returns the current set.
func (r *Renewing) Credentials() Credentials {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// Token returns the access token, renewing it first when it is due.
func (r *Renewing) Token(ctx context.Context) (string, error) {
	return r.fresh(ctx, "")
}

// Due reports whether the next Token renews: the token is due and no
// renewal failed a moment ago (one that did is tried again after a pause,
// not at every call).
func (r *Renewing) Due() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	return r.refused == nil && !now.Before(r.renewAt()) && !now.Before(r.retryAt)
}

// Refused renews the credentials after the relay refused tok, unless they
// were renewed since tok was handed out.
func (r *Renewing) Refused(ctx context.Context, tok string) (string, error) {
	return r.fresh(ctx, tok)
}

// fresh returns a token to use: the current one unless it is due for
// renewal or is refusedTok; else it renews, once for all callers.
func (r *Renewing) fresh(ctx context.Context, refusedTok string) (string, error) {
	renewed := false // by this call, or by one it waited for
	for {
		r.mu.Lock()
		if r.refused != nil {
			r.mu.Unlock()
			return "", r.refused
		}
		if f := r.flight; f != nil {
			// Another call is renewing: wait for it and look again.
			r.mu.Unlock()
			select {
			case <-f.done:
				renewed = f.err == nil
				continue
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
		now := r.now()
		refused := refusedTok != "" && r.cur.AccessToken == refusedTok
		// At most one renewal per call: a token just renewed is used even
		// if it looks due.
		due := !renewed && (refused || !now.Before(r.renewAt()))
		if !due {
			tok := r.cur.AccessToken
			r.mu.Unlock()
			return tok, nil
		}
		if now.Before(r.retryAt) {
			// A renewal failed a moment ago for a passing reason: the
			// token that still works is used meanwhile.
			tok, err := r.cur.AccessToken, r.lastErr
			r.mu.Unlock()
			if refused || !now.Before(r.cur.AccessExpiresAt) {
				return "", err
			}
			return tok, nil
		}
		f := &flight{done: make(chan struct{})}
		r.flight = f
		secret := r.cur.RenewalSecret
		r.mu.Unlock()

		f.err = r.renew(ctx, secret)

		r.mu.Lock()
		r.flight = nil
		var e *Error
		switch {
		case f.err == nil:
		case errors.As(f.err, &e) && !e.Temporary():
			r.refused = renewalRefused(f.err, e)
		case ctx.Err() != nil:
			// This caller gave up; a waiter with time left renews.
		default:
			r.lastErr = fmt.Errorf("client: renewing the credentials: %w", f.err)
			r.retryAt = now.Add(renewPause)
		}
		r.mu.Unlock()
		close(f.done)
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		renewed = f.err == nil
	}
}

// renewalRefused returns the final error of a renewal the relay refused (e,
// within err). The relay gives one 401 for every cause, so the error names
// them and the one step that helps with each: a new invitation.
func renewalRefused(err error, e *Error) error {
	if e.Status != http.StatusUnauthorized {
		return fmt.Errorf("%w: renewal refused (%w)", ErrUnauthorized, err)
	}
	return fmt.Errorf("%w: renewal refused (%w): this device's pairing was removed, or its renewal secret expired or was used by another copy of it; ask an admin for a new invitation and pair again",
		ErrUnauthorized, err)
}

// renew exchanges secret for a new set, saves it, and only then makes it
// current: the relay has marked secret used, so a set that is not saved
// would be lost with the process. When Save fails, the set is dropped and
// the error returned; renewing again with the old secret within 30 s is a
// retry the relay answers with a fresh set, once (docs/PROTOCOL.md,
// /v1/renew). A store that others share is locked for the renewal and
// read under the lock: a set another holder saved is taken up instead.
// A refusal is checked against the store too: a holder that renewed
// without the lock may have spent secret.
func (r *Renewing) renew(ctx context.Context, secret string) error {
	if ls, ok := r.store.(LockingStore); ok {
		unlock, err := ls.Lock(ctx)
		if err != nil {
			return fmt.Errorf("client: locking the credential store: %w", err)
		}
		defer unlock()
		if r.adoptSaved(ctx, secret) {
			return nil
		}
	}
	err := r.exchange(ctx, secret)
	var e *Error
	if errors.As(err, &e) && !e.Temporary() && r.adoptSaved(ctx, secret) {
		return nil
	}
	return err
}

// adoptSaved makes current the set in the store if it is another than the
// one whose secret is secret (another holder renewed), and reports it.
func (r *Renewing) adoptSaved(ctx context.Context, secret string) bool {
	c, err := r.store.Load(ctx)
	if err != nil || c.RenewalSecret == secret || c.valid() != nil {
		return false
	}
	r.mu.Lock()
	r.cur, r.lead, r.obtained, r.life = c, renewLead(c), time.Time{}, 0
	r.mu.Unlock()
	return true
}

// exchange performs the renewal itself: secret for a new set, saved, then current.
func (r *Renewing) exchange(ctx context.Context, secret string) error {
	var c Credentials
	if err := postJSON(ctx, r.hc, r.timeout, r.base+"/v1/renew", map[string]string{"renewal_secret": secret}, &c); err != nil {
		return err
	}
	if err := c.valid(); err != nil {
		return err
	}
	c.URL = r.Credentials().URL
	if err := r.store.Save(ctx, c); err != nil {
		return fmt.Errorf("client: saving renewed credentials: %w", err)
	}
	r.mu.Lock()
	r.cur, r.lead, r.obtained, r.life = c, renewLead(c), r.now(), tokenLife(c)
	r.mu.Unlock()
	return nil
}

// renewAt returns when cur is due: lead before the access token's end, by
// this process's clock from when it received the token, which no skew
// between the clocks moves, or by the relay's exp for credentials loaded
// from the store. r.mu is held.
func (r *Renewing) renewAt() time.Time {
	end := r.cur.AccessExpiresAt
	if !r.obtained.IsZero() && r.life > 0 {
		end = r.obtained.Add(r.life)
	}
	return end.Add(-r.lead)
}

// originOnly returns a copy of hc (a new client when nil) that refuses
// redirects to another origin, as the Client does.
func originOnly(hc *http.Client) *http.Client {
	if hc == nil {
		hc = &http.Client{}
	}
	c := *hc
	c.CheckRedirect = sameOriginOnly(hc.CheckRedirect)
	return &c
}

// postJSON posts in as JSON to url and decodes a 200's JSON into out;
// another answer is a *Error.
func postJSON(ctx context.Context, hc *http.Client, timeout time.Duration, url string, in, out any) error {
	if hc.Timeout == 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	b, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("client: encoding: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("client: POST %s: %w", url, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("client: POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("client: POST %s: reading the answer: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return answerError(resp, JSON, body)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("client: POST %s: decoding the answer: %w", url, err)
	}
	return nil
}
