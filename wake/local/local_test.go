package local_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/wake"
	"github.com/flamenet/relay/wake/local"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds a Wait that must return at once; it is generous so a
// loaded machine does not fail the test, and only a lost wake reaches it.
const waitTimeout = 5 * time.Second

func key(i int) device.Key {
	return device.Key{Household: "home", Device: fmt.Sprintf("dev-%d", i)}
}

func subscribe(tb testing.TB, h *local.Hub, k device.Key) wake.Waiter {
	tb.Helper()
	w, err := h.Subscribe(context.Background(), k)
	if err != nil {
		tb.Fatalf("Subscribe(%v): %v", k, err)
	}
	return w
}

func waitFor(w wake.Waiter, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return w.Wait(ctx)
}

// A signal that lands after Subscribe and before Wait must be kept: the
// poll reads the store between the two, and an envelope committed in that
// gap is only noticed through this wake. Many devices run at once so that
// the shards and the race detector see contention.
//
// Guard: the waiter's capacity-1 channel. Made unbuffered (so the
// non-blocking send finds no receiver and drops the wake), this test went
// red on the first iteration of every goroutine (Wait hit its timeout).
func TestSignalBeforeWaitIsKept(t *testing.T) {
	h := newHub(t)
	const (
		devices    = 16
		iterations = 2000
	)
	var wg sync.WaitGroup
	for d := range devices {
		wg.Go(func() {
			k := key(d)
			// The sender runs in its own goroutine, as a send would.
			req := make(chan struct{})
			ack := make(chan error)
			go func() {
				for range req {
					ack <- h.Signal(context.Background(), wakes(k))
				}
				close(ack)
			}()
			defer func() {
				close(req)
				for range ack {
				}
			}()
			for i := range iterations {
				w, err := h.Subscribe(context.Background(), k)
				if err != nil {
					t.Errorf("Subscribe: %v", err)
					return
				}
				req <- struct{}{}
				if err := <-ack; err != nil {
					t.Errorf("Signal: %v", err)
					w.Close()
					return
				}
				// The signal has landed; only now does the poll wait.
				err = waitFor(w, waitTimeout)
				w.Close()
				if err != nil {
					t.Errorf("device %d iteration %d: Wait = %v, want nil (wake lost)", d, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// Signals racing with Wait (no handoff) still wake every Wait they precede,
// and many signals before one Wait collapse into a single wake.
func TestSignalsCollapse(t *testing.T) {
	h := newHub(t)
	k := key(1)
	w := subscribe(t, h, k)
	defer w.Close()
	for range 5 {
		if err := h.Signal(context.Background(), wakes(k)); err != nil {
			t.Fatalf("Signal: %v", err)
		}
	}
	if err := waitFor(w, waitTimeout); err != nil {
		t.Fatalf("first Wait = %v, want nil", err)
	}
	if err := waitFor(w, 50*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Wait = %v, want deadline (signals should collapse)", err)
	}
}

func TestSignalOnlyWakesItsKey(t *testing.T) {
	h := newHub(t)
	a, b := key(1), key(2)
	wa := subscribe(t, h, a)
	defer wa.Close()
	wb := subscribe(t, h, b)
	defer wb.Close()
	if err := h.Signal(context.Background(), wakes(a, key(3))); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if err := waitFor(wa, waitTimeout); err != nil {
		t.Fatalf("Wait(a) = %v, want nil", err)
	}
	if err := waitFor(wb, 50*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait(b) = %v, want deadline", err)
	}
	// Same device name in another household is another key.
	other := device.Key{Household: "other", Device: a.Device}
	if h.Held(other) {
		t.Fatalf("Held(%v) = true, want false", other)
	}
}

func TestSignalWithoutWaiterIsNoop(t *testing.T) {
	h := newHub(t)
	k := key(1)
	if err := h.Signal(context.Background(), wakes(k)); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if h.Held(k) {
		t.Fatal("Held after Signal with no waiter")
	}
	// A signal sent before Subscribe belongs to no poll; the poll's own read
	// covers it, so the new waiter must not see it.
	w := subscribe(t, h, k)
	defer w.Close()
	if err := waitFor(w, 50*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want deadline", err)
	}
}

func TestSupersede(t *testing.T) {
	h := newHub(t)
	k := key(1)
	old := subscribe(t, h, k)
	defer old.Close()
	// A signal still pending on the old waiter does not hide that it was
	// superseded: the old poll must answer, not wait again.
	if err := h.Signal(context.Background(), wakes(k)); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	neu := subscribe(t, h, k)
	defer neu.Close()

	for range 2 {
		if err := waitFor(old, waitTimeout); !errors.Is(err, wake.ErrSuperseded) {
			t.Fatalf("old Wait = %v, want ErrSuperseded", err)
		}
	}
	if !h.Held(k) {
		t.Fatal("Held = false with the new waiter registered")
	}
	if err := waitFor(neu, 50*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("new Wait = %v, want deadline (the old waiter's signal is not the new one's)", err)
	}
	if err := h.Signal(context.Background(), wakes(k)); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if err := waitFor(neu, waitTimeout); err != nil {
		t.Fatalf("new Wait = %v, want nil", err)
	}
}

// A blocked Wait is ended by a newer Subscribe at once.
func TestSupersedeWhileWaiting(t *testing.T) {
	h := newHub(t)
	k := key(1)
	old := subscribe(t, h, k)
	defer old.Close()
	got := make(chan error, 1)
	go func() { got <- old.Wait(context.Background()) }()
	neu := subscribe(t, h, k)
	defer neu.Close()
	select {
	case err := <-got:
		if !errors.Is(err, wake.ErrSuperseded) {
			t.Fatalf("Wait = %v, want ErrSuperseded", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("superseded Wait did not return")
	}
}

// Guard: Waiter.Close deletes only its own registration. With the identity
// check removed (delete whatever is registered for the key), this test went
// red: Held turned false and the new waiter missed its signal.
func TestCloseOfSupersededKeepsSuccessor(t *testing.T) {
	h := newHub(t)
	k := key(1)
	old := subscribe(t, h, k)
	neu := subscribe(t, h, k)
	defer neu.Close()

	old.Close()
	old.Close() // twice is safe
	if !h.Held(k) {
		t.Fatal("Held = false after the superseded waiter closed; it removed its successor")
	}
	if err := h.Signal(context.Background(), wakes(k)); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if err := waitFor(neu, waitTimeout); err != nil {
		t.Fatalf("successor Wait = %v, want nil", err)
	}
	neu.Close()
	if h.Held(k) {
		t.Fatal("Held = true after the registered waiter closed")
	}
}

func TestCtxCancelFreesAtOnce(t *testing.T) {
	h := newHub(t)
	k := key(1)
	w := subscribe(t, h, k)
	if !h.Held(k) {
		t.Fatal("Held = false after Subscribe")
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() { got <- w.Wait(ctx) }()
	cancel()
	select {
	case err := <-got:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v, want context.Canceled", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Wait did not return after cancel")
	}
	w.Close()
	if h.Held(k) {
		t.Fatal("Held = true after Close")
	}
	if err := waitFor(w, waitTimeout); !errors.Is(err, wake.ErrClosed) {
		t.Fatalf("Wait after Close = %v, want ErrClosed", err)
	}
}

func TestHubClose(t *testing.T) {
	h := local.New(nil)
	blocked := subscribe(t, h, key(1))
	defer blocked.Close()
	pending := subscribe(t, h, key(2))
	defer pending.Close()

	got := make(chan error, 1)
	go func() { got <- blocked.Wait(context.Background()) }()
	// A pending signal does not outrank the drain.
	if err := h.Signal(context.Background(), wakes(key(2))); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if err := h.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := h.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, wake.ErrClosed) {
			t.Fatalf("blocked Wait = %v, want ErrClosed", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("blocked Wait did not return after hub Close")
	}
	if err := waitFor(pending, waitTimeout); !errors.Is(err, wake.ErrClosed) {
		t.Fatalf("pending Wait = %v, want ErrClosed", err)
	}
	w, err := h.Subscribe(context.Background(), key(3))
	if !errors.Is(err, wake.ErrClosed) || w != nil {
		t.Fatalf("Subscribe after Close = %v, %v; want nil, ErrClosed", w, err)
	}
	if h.Held(key(3)) {
		t.Fatal("a refused Subscribe registered a waiter")
	}
}

// Subscribe racing Close: every waiter is either refused or ended with
// ErrClosed; none is left waiting on a closed hub.
//
// Guard: Subscribe reads the closed flag under the shard lock. With the
// check moved before the lock (and a yield between check and lock to widen
// the window), this test went red: waiters registered after Close had
// passed their shard and were never ended.
func TestCloseRacingSubscribe(t *testing.T) {
	for round := range 20 {
		h := local.New(nil)
		var (
			wg         sync.WaitGroup
			mu         sync.Mutex
			waiters    []*local.Waiter
			registered atomic.Int64
		)
		// Close lands once subscribers are well under way.
		busy := make(chan struct{})
		for i := range 8 {
			wg.Go(func() {
				for j := range 2000 {
					w, err := h.SubscribeLocal(key(i*10000 + j))
					if errors.Is(err, wake.ErrClosed) {
						return
					}
					if err != nil {
						t.Errorf("Subscribe: %v", err)
						return
					}
					mu.Lock()
					waiters = append(waiters, w)
					mu.Unlock()
					if registered.Add(1) == 200 {
						close(busy)
					}
				}
			})
		}
		<-busy
		if err := h.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		wg.Wait()
		for _, w := range waiters {
			if err := w.Err(); !errors.Is(err, wake.ErrClosed) {
				t.Fatalf("round %d: waiter %v registered around Close has Err = %v, want ErrClosed", round, w.Key(), err)
			}
			w.Close()
		}
	}
}

// Many goroutines subscribe, signal and close on a few shared keys. The race
// detector checks the shard locks; at the end nothing may stay registered.
//
// Guard: the shard mutex. With the lock removed from Signal, the race
// detector failed this test.
func TestConcurrentChurn(t *testing.T) {
	h := newHub(t)
	const keys = 8
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := h.Signal(context.Background(), wakes(key(i%keys), key((i+1)%keys))); err != nil {
					t.Errorf("Signal: %v", err)
					return
				}
			}
		})
	}
	var polls sync.WaitGroup
	for i := range 16 {
		polls.Go(func() {
			for range 200 {
				w, err := h.Subscribe(context.Background(), key(i%keys))
				if err != nil {
					t.Errorf("Subscribe: %v", err)
					return
				}
				err = waitFor(w, time.Millisecond)
				if err != nil && !errors.Is(err, wake.ErrSuperseded) && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Wait = %v", err)
				}
				w.Close()
			}
		})
	}
	polls.Wait()
	close(stop)
	wg.Wait()
	for i := range keys {
		if h.Held(key(i)) {
			t.Errorf("Held(%v) = true after every waiter closed", key(i))
		}
	}
}

// newHub returns a hub closed at the end of the test.
func newHub(tb testing.TB) *local.Hub {
	tb.Helper()
	h := local.New(nil)
	tb.Cleanup(func() { _ = h.Close() })
	return h
}

// BenchmarkSubscribeSignalWait is one held poll's life on the hub:
// Subscribe, a send's Signal, the Wait it wakes, Close. Each goroutine uses
// its own devices, as real polls do.
func BenchmarkSubscribeSignalWait(b *testing.B) {
	h := local.New(nil)
	defer h.Close()
	var next atomic.Int64
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		base := int(next.Add(1)) * 1000
		keys := make([]device.Key, 1000)
		for i := range keys {
			keys[i] = key(base + i)
		}
		i := 0
		for pb.Next() {
			k := keys[i%len(keys)]
			i++
			w, err := h.Subscribe(ctx, k)
			if err != nil {
				b.Fatal(err)
			}
			if err := h.Signal(ctx, wakes(k)); err != nil {
				b.Fatal(err)
			}
			if err := w.Wait(ctx); err != nil {
				b.Fatal(err)
			}
			w.Close()
		}
	})
}

// BenchmarkSignalNoWaiter is a send to a device with no held poll.
func BenchmarkSignalNoWaiter(b *testing.B) {
	h := local.New(nil)
	defer h.Close()
	keys := []device.Key{key(1)}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := h.Signal(ctx, wakes(keys...)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// wakes is a wake for each key, at head 1.
func wakes(keys ...device.Key) []wake.Wake {
	ws := make([]wake.Wake, len(keys))
	for i, k := range keys {
		ws[i] = wake.Wake{Key: k, Head: 1}
	}
	return ws
}

// TestWatch: a watched waiter's callback runs on a signal, at the end, and
// at once for news that came before Watch; Ready tells which, the end
// first, and takes a signal as Wait does.
func TestWatch(t *testing.T) {
	h := local.New(nil)
	k := device.Key{Household: "h", Device: "d"}
	sub := func() wake.Watcher {
		t.Helper()
		w, err := h.Subscribe(context.Background(), k)
		if err != nil {
			t.Fatal(err)
		}
		return w.(wake.Watcher)
	}
	signal := func() {
		t.Helper()
		if err := h.Signal(context.Background(), []wake.Wake{{Key: k, Head: 1}}); err != nil {
			t.Fatal(err)
		}
	}

	w := sub()
	var calls atomic.Int32
	w.Watch(func() { calls.Add(1) })
	if ready, err := w.Ready(); ready || err != nil || calls.Load() != 0 {
		t.Fatalf("before any news: Ready %v %v, %d calls", ready, err, calls.Load())
	}
	signal()
	if calls.Load() != 1 {
		t.Fatalf("a signal made %d calls, want 1", calls.Load())
	}
	if ready, err := w.Ready(); !ready || err != nil {
		t.Fatalf("after a signal: Ready %v %v, want true, nil", ready, err)
	}
	if ready, _ := w.Ready(); ready {
		t.Fatal("Ready did not take the signal")
	}

	// A signal before Watch: called at once.
	signal()
	var early atomic.Int32
	w.Watch(func() { early.Add(1) })
	if early.Load() != 1 {
		t.Fatalf("a signal before Watch made %d calls, want 1", early.Load())
	}

	// Superseded with a signal pending: the end comes first.
	newer := sub()
	if early.Load() < 2 {
		t.Fatal("the end made no call")
	}
	if ready, err := w.Ready(); !ready || !errors.Is(err, wake.ErrSuperseded) {
		t.Fatalf("superseded: Ready %v %v, want true, ErrSuperseded", ready, err)
	}
	newer.Close()
}
