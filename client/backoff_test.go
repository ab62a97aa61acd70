package client

import (
	"testing"
	"time"
)

// pauseBounds is the least and the most b's next pause can be after err,
// without counting a refusal.
func pauseBounds(b retryPause, err error) (lo, hi time.Duration) {
	least, most := b, b
	least.rand = func(int64) int64 { return 0 }
	most.rand = func(n int64) int64 { return n - 1 }
	return least.next(err), most.next(err)
}

// TestBackoff: the client's settings of the backoff (internal/backoff): at
// least Retry-After plus up to as much again, doubling on refusals in a
// row up to the cap, from 1 s without a Retry-After, starting over after a
// reset, and a Retry-After above the cap honoured exactly.
func TestBackoff(t *testing.T) {
	b := &retryPause{max: time.Minute}
	refused := &Error{Status: 429, RetryAfter: 2 * time.Second}
	for i, want := range [][2]time.Duration{
		{2 * time.Second, 4 * time.Second},
		{4 * time.Second, 8 * time.Second},
		{8 * time.Second, 16 * time.Second},
		{16 * time.Second, 32 * time.Second},
		{32 * time.Second, time.Minute},
		{time.Minute, time.Minute},
		{time.Minute, time.Minute},
	} {
		if lo, hi := pauseBounds(*b, refused); lo != want[0] || hi != want[1] {
			t.Fatalf("refusal %d: [%v, %v], want [%v, %v]", i+1, lo, hi, want[0], want[1])
		}
		b.next(refused)
	}
	b.reset()
	if lo, hi := pauseBounds(*b, errTransport{}); lo != time.Second || hi != 2*time.Second {
		t.Fatalf("after reset, no Retry-After: [%v, %v], want [1s, 2s]", lo, hi)
	}
	// Retry-After is honoured even above the cap, and no failure is
	// retried within a second.
	small := retryPause{max: time.Second}
	if lo, hi := pauseBounds(small, &Error{Status: 503, RetryAfter: 5 * time.Second}); lo != 5*time.Second || hi != 5*time.Second {
		t.Fatalf("capped below Retry-After: [%v, %v], want 5s", lo, hi)
	}
	tiny := retryPause{max: 10 * time.Millisecond, n: 3}
	if lo, hi := pauseBounds(tiny, errTransport{}); lo != time.Second || hi != time.Second {
		t.Fatalf("cap below a second: [%v, %v], want 1s", lo, hi)
	}
}

type errTransport struct{}

func (errTransport) Error() string { return "connection reset" }
