package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/flamenet/relay/internal/backoff"
)

// Register creates the token's device or, when it exists, counts as its
// activity; it returns the device's cursor as the relay knows it. A device
// need not register before it polls (its first poll registers it), but a
// recipient must exist before anyone can send to it. opts publish the
// device's identity key or push target (WithIdentityKey, WithPushTarget).
func (c *Client) Register(ctx context.Context, opts ...RegisterOption) (Registration, error) {
	var req registerRequest
	for _, o := range opts {
		o(&req)
	}
	var out Registration
	err := c.do(ctx, c.requestTimeout, http.MethodPost, "/v1/register", req, http.StatusOK, &out)
	return out, err
}

type sendRequest struct {
	ID      string   `json:"id" msgpack:"id"`
	To      []string `json:"to" msgpack:"to"`
	Payload []byte   `json:"payload" msgpack:"payload"`
}

// SendOnce makes exactly one send request: payload to the devices in to,
// under the sender's own id. A *Error says how the relay refused; any other
// error means no answer came, and whether the relay stored the send is
// unknown: send again with the same id and payload to find out.
func (c *Client) SendOnce(ctx context.Context, id string, to []string, payload []byte) (SendResult, error) {
	var out SendResult
	err := c.do(ctx, c.requestTimeout, http.MethodPost, "/v1/send", sendRequest{ID: id, To: to, Payload: payload}, http.StatusAccepted, &out)
	return out, err
}

// Send sends payload to the devices in to and retries until the relay
// stores it, refuses it for good, or ctx ends. Every attempt carries the
// same id and body, so a retry after a lost answer gets the first answer
// and nothing is stored twice: pick a fresh id (NewID) per send, not per
// attempt. It retries no answer, 429, 500 and 503, pausing as backoff
// says; 400, 401, 403, 404 (unknown_device included), 409 and 413 return
// at once as a *Error, a redirect to another origin as a *RedirectError.
func (c *Client) Send(ctx context.Context, id string, to []string, payload []byte) (SendResult, error) {
	bo := c.newRetryPause()
	for {
		res, err := c.SendOnce(ctx, id, to, payload)
		if err == nil {
			return res, nil
		}
		if ctx.Err() != nil {
			return SendResult{}, fmt.Errorf("client: send %s: %w (last attempt: %w)", id, ctx.Err(), err)
		}
		if !retryable(err) {
			return SendResult{}, err
		}
		d := bo.next(err)
		c.logf("send %s: %v; retrying in %v", id, err, d.Round(time.Millisecond))
		c.state(State{Kind: StateRetrying, Delay: d, Err: err})
		if err := sleep(ctx, d); err != nil {
			return SendResult{}, fmt.Errorf("client: send %s: %w", id, err)
		}
	}
}

// PollQuery is one poll's parameters.
type PollQuery struct {
	// Cursor acknowledges everything at or below it and asks for what is
	// above. Always send the persisted cursor.
	Cursor int64
	// OmitCursor leaves the cursor out: nothing is acknowledged, and the
	// answer starts above the cursor the relay knows for the device. Only
	// for recovery (see Listen), where Epoch is left out too.
	OmitCursor bool
	// Epoch is the store epoch Cursor was taken in ("": not checked).
	// Always send the persisted one with the cursor: a relay whose store's
	// history went back since then answers 409 cursor_ahead instead of
	// acknowledging seqs that now name other envelopes.
	Epoch string
	// Wait is how long the relay may hold the poll, in seconds (0: answer
	// at once).
	Wait int
	// Limit is the most envelopes to return (0: the relay's default).
	Limit int
}

// Poll makes one poll request. The request may take Wait seconds plus a
// margin (or the HTTP client's own Timeout) before it counts as
// unanswered.
func (c *Client) Poll(ctx context.Context, q PollQuery) (PollResult, error) {
	path := "/v1/poll?wait=" + strconv.Itoa(q.Wait)
	if !q.OmitCursor {
		path += "&cursor=" + strconv.FormatInt(q.Cursor, 10)
	}
	if q.Epoch != "" {
		path += "&epoch=" + url.QueryEscape(q.Epoch)
	}
	if q.Limit > 0 {
		path += "&limit=" + strconv.Itoa(q.Limit)
	}
	var out PollResult
	timeout := time.Duration(q.Wait)*time.Second + pollMargin
	err := c.do(ctx, timeout, http.MethodGet, path, nil, http.StatusOK, &out)
	return out, err
}

type ackRequest struct {
	Cursor int64  `json:"cursor" msgpack:"cursor"`
	Epoch  string `json:"epoch,omitempty" msgpack:"epoch,omitempty"`
}

// Ack acknowledges everything at or below p's cursor without polling, in
// one request; p's epoch, when not "", is checked. A cursor above the
// device's head, or an epoch that is not the store's current one, is a
// *Error with CursorAhead, and nothing is acknowledged.
func (c *Client) Ack(ctx context.Context, p Position) error {
	return c.do(ctx, c.requestTimeout, http.MethodPost, "/v1/ack", ackRequest(p), http.StatusNoContent, nil)
}

// retryable: no answer at all, or an answer that says "later".
func retryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Temporary()
	}
	var r *RedirectError
	return !errors.As(err, &r)
}

// retryPause is the pause between retries the protocol asks for: at least
// Retry-After (1 s when the answer had none, or there was no answer; never
// more than MaxRetryAfter), doubled on each refusal in a row up to a cap,
// plus a random extra of up to as much again so that refused clients do not
// come back together.
type retryPause struct {
	max  time.Duration
	n    int                 // refusals in a row
	rand func(n int64) int64 // nil: math/rand/v2's
}

func (c *Client) newRetryPause() *retryPause { return &retryPause{max: c.maxBackoff} }

func (b *retryPause) next(err error) time.Duration {
	start := time.Second
	var e *Error
	if errors.As(err, &e) && e.RetryAfter > 0 {
		start = e.RetryAfter
	}
	// The doubling starts at what the relay asked for, which is also the
	// floor: the cap holds with the extra too, but never below it.
	d := backoff.Policy{Base: start, Cap: b.max, Rand: b.rand}.Wait(b.n, start)
	b.n++
	return d
}

func (b *retryPause) reset() { b.n = 0 }

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
