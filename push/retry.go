package push

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"
)

// maxBackoff caps one wait; the push's deadline caps them all.
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
		wait := backoff(q.cfg.RetryBase, attempt, re.After)
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

// backoff is the wait before retry number attempt: exponential from base,
// jittered over its upper half so that retries spread out, and never
// shorter than the provider's Retry-After (plus up to a tenth more, so that
// pushes told the same instant do not all come back at it).
func backoff(base time.Duration, attempt int, after time.Duration) time.Duration {
	d := base << min(attempt-1, 20)
	if d <= 0 || d > maxBackoff {
		d = maxBackoff
	}
	d = d/2 + rand.N(d/2+1)
	if after > d {
		d = after + rand.N(after/10+1)
	}
	return d
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
