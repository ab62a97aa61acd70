package schedule

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestScheduleTimes(t *testing.T) {
	start := time.Unix(1000, 0)
	s := New(start, 20, 3*time.Second)
	if s.N != 60 {
		t.Fatalf("n = %d, want 60", s.N)
	}
	if got, want := s.At(0), start; !got.Equal(want) {
		t.Errorf("at(0) = %v, want %v", got, want)
	}
	if got, want := s.At(59), start.Add(2950*time.Millisecond); !got.Equal(want) {
		t.Errorf("at(59) = %v, want %v", got, want)
	}
	if got := New(start, 1000, 10*time.Second).N; got != 10000 {
		t.Errorf("1000/s for 10s: n = %d", got)
	}
}

// TestOpenLoopDoesNotWaitForSlowSends: a relay that takes 300 ms per send
// must not lower the offered load. 50 sends at 100/s take half a second
// to start open-loop and 15 s closed-loop. Calling fire synchronously in
// OpenLoop (the guard removed) turned this test red, as it should.
func TestOpenLoopDoesNotWaitForSlowSends(t *testing.T) {
	s := New(time.Now().Add(20*time.Millisecond), 100, 500*time.Millisecond)
	var (
		mu       sync.Mutex
		lastLate time.Duration
		inFlight atomic.Int64
		peak     atomic.Int64
		fired    atomic.Int64
	)
	// Every fire holds until 300 ms after the last one was due.
	release := make(chan struct{})
	time.AfterFunc(time.Until(s.At(s.N-1))+300*time.Millisecond, func() { close(release) })
	OpenLoop(context.Background(), s, 1000, func(i int, at time.Time) {
		late := time.Since(at)
		n := inFlight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		mu.Lock()
		lastLate = max(lastLate, late)
		mu.Unlock()
		fired.Add(1)
		<-release
		inFlight.Add(-1)
	})
	if got := fired.Load(); got != int64(s.N) {
		t.Fatalf("fired %d, want %d", got, s.N)
	}
	// Generous: a shared machine may delay a timer, never by a whole send.
	if lastLate > 250*time.Millisecond {
		t.Errorf("a send started %v after its schedule", lastLate)
	}
	if got := peak.Load(); got < int64(s.N)/2 {
		t.Errorf("peak in flight = %d, want most of the %d sends at once", got, s.N)
	}
}

// TestOpenLoopLimit: past the limit, fires wait (and start late) rather
// than pile up without bound.
func TestOpenLoopLimit(t *testing.T) {
	s := New(time.Now(), 1000, 50*time.Millisecond)
	var inFlight, peak atomic.Int64
	OpenLoop(context.Background(), s, 3, func(int, time.Time) {
		n := inFlight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(5 * time.Millisecond) // a slow send, not a synchronisation
		inFlight.Add(-1)
	})
	if got := peak.Load(); got > 3 || got < 1 {
		t.Errorf("peak in flight = %d, want 1..3", got)
	}
}

func TestOpenLoopStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := New(time.Now(), 10, time.Hour)
	var fired atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		OpenLoop(ctx, s, 10, func(int, time.Time) {
			if fired.Add(1) == 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("OpenLoop did not return after cancel")
	}
	if got := fired.Load(); got < 3 || got > 4 {
		t.Errorf("fired %d after cancel at 3", got)
	}
}
