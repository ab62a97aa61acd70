package client

import (
	"testing"
	"time"
)

// TestBackoff: at least Retry-After plus up to as much again, doubling on
// refusals in a row, capped, and starting over after a reset.
func TestBackoff(t *testing.T) {
	b := &backoff{max: time.Minute}
	refused := &Error{Status: 429, RetryAfter: 2 * time.Second}
	lo := 2 * time.Second
	for i := range 8 {
		for range 50 { // the extra is random: look at many draws
			c := *b
			d := c.next(refused)
			hi := min(2*lo, time.Minute)
			if d < min(lo, time.Minute) || d > hi {
				t.Fatalf("refusal %d: %v outside [%v, %v]", i+1, d, lo, hi)
			}
		}
		b.next(refused)
		lo = min(2*lo, time.Minute)
	}
	b.reset()
	if d := b.next(errTransport{}); d < time.Second || d > 2*time.Second {
		t.Fatalf("after reset, no Retry-After: %v, want 1-2 s", d)
	}
	// Retry-After is honoured even above the cap.
	small := &backoff{max: time.Second}
	if d := small.next(&Error{Status: 503, RetryAfter: 5 * time.Second}); d != 5*time.Second {
		t.Fatalf("capped below Retry-After: %v", d)
	}
}

type errTransport struct{}

func (errTransport) Error() string { return "connection reset" }
