package push

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/flamenet/relay/internal/backoff"
)

// maxBackoff caps one wait, but for a longer Retry-After; the push's
// deadline caps them all.
const maxBackoff = 30 * time.Second

// deliver pushes once and retries what the provider says may succeed later,
// never past ctx's deadline.
func (q *Queue) deliver(ctx context.Context, p Provider, address, kind string) error {
	for attempt := 1; ; attempt++ {
		err := p.Push(ctx, address)
		var re *RetryableError
		if err == nil || !errors.As(err, &re) {
			return err
		}
		if attempt >= q.cfg.MaxAttempts {
			return fmt.Errorf("push: giving up after %d attempts: %w", attempt, err)
		}
		wait := retryPolicy(q.cfg.RetryBase).Wait(attempt-1, re.After)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return fmt.Errorf("push: retry in %v would pass the deadline: %w", wait.Round(time.Millisecond), err)
		}
		q.retried.Add(1)
		q.metrics.retry(kind)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("push: %w while waiting to retry: %w", ctx.Err(), err)
		}
	}
}

// retryPolicy is the backoff of retries from base: retry number attempt
// waits within the upper half of base doubled attempt-1 times (half of it
// doubled, plus up to as much again), never shorter than the provider's
// Retry-After (plus up to a tenth more, so that pushes told the same
// instant do not all come back at it).
func retryPolicy(base time.Duration) backoff.Policy {
	return backoff.Policy{Base: base / 2, Cap: maxBackoff}
}

// retryAfter reads a Retry-After header: delay-seconds or an HTTP date.
func retryAfter(h http.Header, now time.Time) time.Duration {
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, 3600)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return min(d, time.Hour)
		}
	}
	return 0
}

// retryable reports whether a status may succeed later.
func retryable(status int) bool {
	return status == http.StatusTooManyRequests || status >= 500
}
