// Package client speaks the relay protocol (docs/PROTOCOL.md) from the
// device side: sending envelopes with retries that never store one twice,
// and a poll loop that hands each envelope to the app exactly once, in seq
// order, with the cursor persisted in between.
//
//	c, _ := client.New(cmp.Or(os.Getenv("FN_RELAY_URL"), "http://127.0.0.1:8080"), token)
//	res, err := c.Send(ctx, client.NewID(), []string{"phone"}, []byte("hello"))
//
//	err = c.Listen(ctx, client.FileCursor("phone.cursor"), func(ctx context.Context, e client.Envelope) error {
//		return process(e.Payload) // the cursor moves past e only when this returns nil
//	})
//
// Send, Poll and Ack make one request each through the *Once and plain
// variants; Send and Listen retry as the protocol's "What a correct client
// does" says. A Sealer (NewSealer) sends and listens with envelopes sealed
// end to end (package seal, docs/E2E.md). Devices and Directory read the
// household's directory; an admin device (a token of scope admin) also
// invites devices (Invite, Invitations, CancelInvitation) and removes them
// (RemoveDevice).
//
// # Paired devices
//
// A device paired with an invitation's code holds a short-lived access
// token and a long-lived renewal secret instead of a fixed token. Pair
// redeems the code and saves the credentials in a CredentialStore
// (FileStore: a JSON file, 0600, replaced atomically); a *Renewing source
// keeps them fresh:
//
//	store := client.FileStore("phone.json")
//	_, err := client.Pair(ctx, url, "ABCDE-FGHJK", client.PairOptions{Store: store})
//	src, err := client.NewRenewing(ctx, url, store, client.RenewingOptions{})
//	c, err := client.NewWithCredentials(url, src, client.WithStateFunc(show))
//
// It renews when less than a third of the access token's life is left (or
// 5 minutes, whichever is less) and once when the relay answers 401, then
// makes the call again once; it saves each new set before using it, since
// the renewal spent the old secret; concurrent calls wait for one
// renewal. A refused renewal (the secret was replayed elsewhere, which
// revokes all of the device's secrets; it expired; the device was removed)
// is final: calls fail with an error wrapping ErrUnauthorized, whose text
// ends with the next step (a new invitation), and WithStateFunc's
// callback hears StateUnauthorized. New(url, token) is
// NewWithCredentials(url, StaticToken(token)).
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

const (
	// DefaultWait is how long Listen's polls are held, in seconds.
	DefaultWait = 20
	// pollMargin is how much longer than its wait a poll may take before
	// the client gives up on it: the relay answers within the wait, and
	// proxies and a slow network add to it.
	pollMargin = 15 * time.Second
	// DefaultRequestTimeout bounds a request other than a held poll.
	DefaultRequestTimeout = 30 * time.Second
	// maxAnswer bounds what is read of one answer: a poll returns at most
	// 2 MiB of payload (FN_POLL_BUDGET_BYTES) plus one envelope beyond it.
	maxAnswer = 64 << 20
	// MaxRetryAfter caps the Retry-After the client honours, as the
	// TypeScript client does. The relay asks for 1 to 5 s; a larger value
	// comes from a misconfigured proxy, and waiting days for it would stop
	// the client as surely as a tight loop floods the relay.
	MaxRetryAfter = time.Minute
)

// Client talks to one relay as one device (the token's). It is safe for
// concurrent use, but a device runs one Listen at a time: a newer poll ends
// the older one (docs/PROTOCOL.md, Holding).
type Client struct {
	base           string
	creds          CredentialSource
	state          func(State)
	hc             *http.Client
	codec          Codec
	wait           int
	requestTimeout time.Duration
	maxBackoff     time.Duration
	logf           func(format string, args ...any)
	// streams: Listen streams where it can (WithStreams).
	streams bool
	// transport is what Listen receives over now (a string), for the
	// state its other calls report.
	transport atomic.Value
}

// Option changes a Client made by New.
type Option func(*Client)

// WithHTTPClient uses hc for every request. Many clients, one per token,
// may share one hc and so its connections; a Client holds nothing else
// that costs. Leave hc's Timeout 0 and the client bounds each request
// itself; set it and it bounds every request instead, held polls too, so
// it must be longer than the poll wait plus a margin, or Listen refuses to
// start. The client uses a copy of hc (same Transport, Jar and Timeout)
// whose CheckRedirect refuses a redirect to another origin before hc's own
// CheckRedirect is asked; hc itself is not changed.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithStreams sets whether Listen streams. With false it polls only; by
// default it streams where the relay (and what is in front of it) can.
func WithStreams(on bool) Option { return func(c *Client) { c.streams = on } }

// WithCodec picks JSON (the default) or MessagePack.
func WithCodec(codec Codec) Option { return func(c *Client) { c.codec = codec } }

// WithWait sets how long Listen's polls are held, in seconds (1 to the
// relay's FN_MAX_WAIT_SECS; 20 to 60 is good).
func WithWait(seconds int) Option { return func(c *Client) { c.wait = seconds } }

// WithRequestTimeout bounds each request other than a held poll (default
// 30 s); past it the request counts as unanswered and Send retries it. An
// HTTP client with a Timeout of its own (WithHTTPClient) overrides it.
func WithRequestTimeout(d time.Duration) Option { return func(c *Client) { c.requestTimeout = d } }

// WithMaxBackoff caps the doubling of the pause between retries (default
// one minute). A Retry-After above it is still honoured, up to
// MaxRetryAfter.
func WithMaxBackoff(d time.Duration) Option { return func(c *Client) { c.maxBackoff = d } }

// WithLogf receives one line per retry and recovery (for diagnostics; the
// default says nothing).
func WithLogf(logf func(format string, args ...any)) Option {
	return func(c *Client) { c.logf = logf }
}

// New makes a client of the relay at baseURL (http://host:port, no path)
// acting with token. The token goes to baseURL's origin only: a redirect
// to another scheme, host or port is not followed (*RedirectError).
func New(baseURL, token string, opts ...Option) (*Client, error) {
	token = strings.TrimSpace(token)
	if token == "" {
		return nil, errors.New("client: no token")
	}
	return NewWithCredentials(baseURL, StaticToken(token), opts...)
}

// NewWithCredentials makes a client of the relay at baseURL that asks src
// for the token of each request (a *Renewing keeps one fresh), and asks it
// once for a fresh one when the relay refuses a token with 401.
func NewWithCredentials(baseURL string, src CredentialSource, opts ...Option) (*Client, error) {
	c := &Client{
		base:           strings.TrimRight(baseURL, "/"),
		creds:          src,
		codec:          JSON,
		wait:           DefaultWait,
		streams:        true,
		requestTimeout: DefaultRequestTimeout,
		maxBackoff:     time.Minute,
		logf:           func(string, ...any) {},
		state:          func(State) {},
	}
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		c.hc = &http.Client{}
	}
	// A copy, so that the caller's client, perhaps shared with code that
	// must follow redirects, keeps its own CheckRedirect.
	hc := *c.hc
	hc.CheckRedirect = sameOriginOnly(c.hc.CheckRedirect)
	c.hc = &hc
	switch {
	case !strings.HasPrefix(c.base, "http://") && !strings.HasPrefix(c.base, "https://"):
		return nil, fmt.Errorf("client: base URL %q is not http:// or https://", baseURL)
	case c.creds == nil:
		return nil, errors.New("client: no credentials")
	case c.codec == nil:
		return nil, errors.New("client: no codec")
	case c.wait < 0:
		return nil, fmt.Errorf("client: wait %d is negative", c.wait)
	case c.requestTimeout <= 0 || c.maxBackoff <= 0:
		return nil, errors.New("client: timeouts and backoff must be positive")
	}
	return c, nil
}

// NewID returns a fresh send id: 16 random bytes in base64url, unique enough
// that two sends of one device never share one.
func NewID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Delivery is one recipient's copy of a send.
type Delivery struct {
	Device string `json:"device" msgpack:"device"`
	Seq    int64  `json:"seq" msgpack:"seq"`
}

// SendResult is the relay's 202: one delivery per recipient, by device name.
type SendResult struct {
	ID         string     `json:"id" msgpack:"id"`
	Deliveries []Delivery `json:"deliveries" msgpack:"deliveries"`
}

// Envelope is one envelope of a poll's answer.
type Envelope struct {
	Seq  int64  `json:"seq" msgpack:"seq"`
	ID   string `json:"id" msgpack:"id"`
	From string `json:"from" msgpack:"from"`
	// SentAt is as the relay wrote it: RFC 3339, UTC, six fractional
	// digits. Time parses it.
	SentAt  string `json:"sent_at" msgpack:"sent_at"`
	Payload []byte `json:"payload" msgpack:"payload"`
}

// Time returns when the relay committed the send.
func (e Envelope) Time() (time.Time, error) { return time.Parse(time.RFC3339Nano, e.SentAt) }

// PollResult is a poll's 200.
type PollResult struct {
	// Cursor is the last seq returned or, with none, the device's cursor
	// as the relay knows it.
	Cursor    int64      `json:"cursor" msgpack:"cursor"`
	More      bool       `json:"more" msgpack:"more"`
	Envelopes []Envelope `json:"envelopes" msgpack:"envelopes"`
	// Epoch is the store epoch the seqs belong to ("" from a relay
	// without epochs): keep it with the cursor and send both.
	Epoch string `json:"epoch" msgpack:"epoch"`
}

// Registration is register's 200.
type Registration struct {
	Household string `json:"household" msgpack:"household"`
	Device    string `json:"device" msgpack:"device"`
	Cursor    int64  `json:"cursor" msgpack:"cursor"`
	// Epoch is the store epoch Cursor belongs to.
	Epoch string `json:"epoch" msgpack:"epoch"`
}

// Error is an answer other than the one a call expects.
type Error struct {
	Status  int    // HTTP status
	Code    string // the protocol's error code ("" when the body was not the relay's)
	Message string
	Head    int64  // with cursor_ahead: the device's head
	Epoch   string // with cursor_ahead: the store's current epoch
	Limit   string // with a 429: which limit refused
	// RetryAfter is the answer's Retry-After, at most MaxRetryAfter (0
	// when absent or not in seconds).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	s := "relay answered " + strconv.Itoa(e.Status)
	if e.Code != "" {
		s += " " + e.Code
	}
	if e.Limit != "" {
		s += " (" + e.Limit + ")"
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Temporary reports whether the same request may succeed later: 429, 500
// and every other 5xx. 400, 401, 403, 404, 409 and 413 never do unchanged.
func (e *Error) Temporary() bool {
	return e.Status == http.StatusTooManyRequests || e.Status >= 500
}

// CursorAhead reports whether the relay said the cursor is above the
// device's head, or was taken in another store epoch than the current one
// (409 cursor_ahead).
func (e *Error) CursorAhead() bool {
	return e.Status == http.StatusConflict && e.Code == "cursor_ahead"
}

type errorBody struct {
	Error   string `json:"error" msgpack:"error"`
	Message string `json:"message" msgpack:"message"`
	Head    int64  `json:"head" msgpack:"head"`
	Epoch   string `json:"epoch" msgpack:"epoch"`
	Limit   string `json:"limit" msgpack:"limit"`
}

// doWith makes one request with token tok. in is encoded with the client's codec (nil: no
// body); a 'want' answer is decoded into out (nil: ignored). timeout
// bounds it unless the HTTP client has a Timeout of its own: one bound,
// the caller's choice, and never a shorter one hidden under it.
func (c *Client) doWith(ctx context.Context, tok string, timeout time.Duration, method, path string, in any, want int, out any) error {
	if c.hc.Timeout == 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var body io.Reader
	if in != nil {
		b, err := c.codec.Marshal(in)
		if err != nil {
			return fmt.Errorf("client: encoding %s: %w", path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Accept", c.codec.ContentType())
	if in != nil {
		req.Header.Set("Content-Type", c.codec.ContentType())
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("client: %s %s: reading the answer: %w", method, path, err)
	}
	codec := codecFor(resp.Header.Get("Content-Type"))
	if resp.StatusCode != want {
		return answerError(resp, codec, b)
	}
	if out == nil {
		return nil
	}
	if err := codec.Unmarshal(b, out); err != nil {
		return fmt.Errorf("client: %s %s: decoding the answer: %w", method, path, err)
	}
	return nil
}

func answerError(resp *http.Response, codec Codec, b []byte) *Error {
	e := &Error{Status: resp.StatusCode}
	var eb errorBody
	if codec.Unmarshal(b, &eb) == nil && eb.Error != "" {
		e.Code, e.Message, e.Head, e.Epoch, e.Limit = eb.Error, eb.Message, eb.Head, eb.Epoch, eb.Limit
	} else {
		// Not the relay's body: a proxy's page or the HTTP server's own
		// plain text. Keep a short, printable piece of it.
		msg := strings.TrimSpace(string(b))
		if len(msg) > 200 {
			msg = msg[:200]
		}
		e.Message = strings.ToValidUTF8(msg, "?")
	}
	e.RetryAfter = retryAfter(resp.Header.Get("Retry-After"))
	return e
}

// retryAfter reads Retry-After's whole seconds, capped at MaxRetryAfter
// before it becomes a Duration, which a large value would overflow.
func retryAfter(h string) time.Duration {
	h = strings.TrimSpace(h)
	if h == "" || strings.Trim(h, "0123456789") != "" {
		return 0 // absent, or an HTTP date, which the relay never sends
	}
	s, err := strconv.ParseInt(h, 10, 64)
	if err != nil || s > int64(MaxRetryAfter/time.Second) {
		return MaxRetryAfter // digits past int64 are past the cap too
	}
	return time.Duration(s) * time.Second
}
