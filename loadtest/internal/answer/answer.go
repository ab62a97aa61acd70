// Package answer sorts the relay's answers as the load's clients do: which
// a careful client sends again, and after how long; which turn a request
// away by admission; and the name each is counted under.
//
// The tester speaks the protocol through the client package, one request
// per call (Register, SendOnce, Poll, Ack): its own retries and counting
// use these, so that every figure counts requests, not the client's
// retries.
package answer

import (
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/internal/backoff"
)

// Retryable reports whether a careful client sends the same request again:
// no answer came (the relay may or may not have done it), or a 503 said to
// come back. Every other answer is definitive.
func Retryable(err error) bool {
	var e *client.Error
	if errors.As(err, &e) {
		return e.Status == http.StatusServiceUnavailable
	}
	return err != nil
}

// TurnedAway reports whether the relay turned the request away by
// admission (429 or 503), which a client retries later rather than counts
// as a fault.
func TurnedAway(e *client.Error) bool {
	return e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable
}

// Kind returns the name of the relay's answer for counting: "<status> <code>", and the
// limit that refused it in parentheses when the relay names one.
func Kind(e *client.Error) string {
	k := strconv.Itoa(e.Status)
	if e.Code != "" {
		k += " " + e.Code
	}
	if e.Limit != "" {
		k += " (" + e.Limit + ")"
	}
	return k
}

// ErrKind returns the name of a request error of op for counting.
func ErrKind(op string, err error) string {
	var e *client.Error
	if errors.As(err, &e) {
		return op + " " + Kind(e)
	}
	if errors.Is(err, client.ErrStreamCut) {
		return op + " cut"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return op + " timeout"
	}
	return op + " transport"
}

// Backoff is how long a careful client waits before it tries again: 25 to
// 50 ms at first, doubling up to a second, and never less than the relay's
// Retry-After (which, at a second or more, is then waited exactly).
var Backoff = backoff.Policy{Base: 25 * time.Millisecond, Cap: time.Second}

// RetryWait returns [Backoff]'s wait before retry number attempt (0 for the
// first) after err.
func RetryWait(attempt int, err error) time.Duration {
	var floor time.Duration
	var se *client.Error
	if errors.As(err, &se) {
		floor = se.RetryAfter
	}
	return Backoff.Wait(attempt, floor)
}
