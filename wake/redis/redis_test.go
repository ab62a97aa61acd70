package redis_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/wake"
	wredis "github.com/flamenet/relay/wake/redis"
)

// Signal leaves exactly one item with a TTL in the device's list, under a
// key whose hash tag is the whole device identity.
func TestSignalLayout(t *testing.T) {
	raw, prefix := sharedRedis(t)
	cfg := wredis.Config{Prefix: prefix, TTL: 30 * time.Second}
	p := newProcess(t, raw, 4, cfg)
	admin := adminClient(t, raw)
	k := wake.Key{Household: "home", Device: "phone"}

	if got, want := p.hub.Key(k), prefix+"{home:phone}"; got != want {
		t.Fatalf("Key = %q, want %q", got, want)
	}
	for range 3 {
		signal(t, p.hub, k, dev(1))
	}
	ctx := context.Background()
	for _, key := range []string{p.hub.Key(k), p.hub.Key(dev(1))} {
		n, err := admin.LLen(ctx, key).Result()
		if err != nil || n != 1 {
			t.Fatalf("LLEN %s = %d, %v; want 1", key, n, err)
		}
		ttl, err := admin.TTL(ctx, key).Result()
		if err != nil || ttl <= 0 || ttl > cfg.TTL {
			t.Fatalf("TTL %s = %v, %v; want in (0, %v]", key, ttl, err, cfg.TTL)
		}
	}
	if p.hub.Held(k) {
		t.Fatal("Held with no waiter")
	}
}

// Two hubs on one Redis are two relay processes: a send on A wakes a poll
// held on B.
func TestCrossProcessWake(t *testing.T) {
	raw, prefix := sharedRedis(t)
	cfg := wredis.Config{Prefix: prefix}
	a := newProcess(t, raw, 4, cfg)
	b := newProcess(t, raw, 4, cfg)
	admin := adminClient(t, raw)
	k := dev(1)

	w := subscribe(t, b.hub, k)
	if !b.hub.Held(k) || a.hub.Held(k) {
		t.Fatalf("Held: b=%v a=%v, want true false", b.hub.Held(k), a.hub.Held(k))
	}
	got := waitAsync(context.Background(), w)
	waitBlocked(t, admin, b.name, 1)
	signal(t, a.hub, k)
	if err := receive(t, got, time.Second, "cross-process wake"); err != nil {
		t.Fatalf("Wait = %v, want nil", err)
	}

	// A send on the poll's own process wakes it directly too.
	got = waitAsync(context.Background(), w)
	signal(t, b.hub, k)
	if err := receive(t, got, time.Second, "same-process wake"); err != nil {
		t.Fatalf("Wait = %v, want nil", err)
	}
}

// A wake pushed after Subscribe (and the poll's store read) and before Wait
// is still in the device's list, so the Wait returns at once. Signals come
// from another process, so the local fast path cannot hide a lost wake.
//
// Guard: the list itself. Broken on purpose by deleting the device's list
// at the start of each Wait (a tempting "drop stale wakes before blocking"),
// which is what a pub/sub channel would do by nature (a message published
// before SUBSCRIBE is gone): this test went red on the first iteration of
// every device, each Wait running into its timeout.
func TestWakeBeforeWaitIsKept(t *testing.T) {
	raw, prefix := sharedRedis(t)
	cfg := wredis.Config{Prefix: prefix}
	a := newProcess(t, raw, 8, cfg)
	b := newProcess(t, raw, 8, cfg)
	const (
		devices    = 4
		iterations = 500
	)
	var wg sync.WaitGroup
	for d := range devices {
		wg.Go(func() {
			k := dev(d)
			for i := range iterations {
				w, err := b.hub.Subscribe(context.Background(), k)
				if err != nil {
					t.Errorf("Subscribe: %v", err)
					return
				}
				// Here the poll would read the store and find nothing.
				if err := a.hub.Signal(context.Background(), wakes(k)); err != nil {
					w.Close()
					t.Errorf("Signal: %v", err)
					return
				}
				err = waitFor(w, 2*time.Second)
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

// A poll with less than a second left waits with a sub-second BRPOP, and
// still wakes on a send from another process.
func TestShortDeadline(t *testing.T) {
	raw, prefix := sharedRedis(t)
	cfg := wredis.Config{Prefix: prefix}
	a := newProcess(t, raw, 4, cfg)
	b := newProcess(t, raw, 4, cfg)
	admin := adminClient(t, raw)
	k := dev(1)
	w := subscribe(t, b.hub, k)

	start := time.Now()
	if err := waitFor(w, 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Wait with a 300ms deadline took %v", d)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 900*time.Millisecond)
	defer cancel()
	got := waitAsync(ctx, w)
	waitBlocked(t, admin, b.name, 1)
	signal(t, a.hub, k)
	if err := receive(t, got, 2*time.Second, "sub-second wait"); err != nil {
		t.Fatalf("Wait = %v, want nil", err)
	}
}

func TestSupersedeAndHandBack(t *testing.T) {
	tests := []struct {
		name string
		// leave ends the old poll's Wait (whose BRPOP stays blocked in
		// Redis for the rest of its round) and returns the waiter that
		// should now get the wake, held on hub next.
		leave func(t *testing.T, old wake.Waiter, cancel context.CancelFunc, b, c *process) (wake.Waiter, *process, error)
	}{
		{
			name: "superseded on the same process",
			leave: func(t *testing.T, old wake.Waiter, _ context.CancelFunc, b, _ *process) (wake.Waiter, *process, error) {
				return subscribe(t, b.hub, dev(1)), b, wake.ErrSuperseded
			},
		},
		{
			name: "client hung up and came back on another process",
			leave: func(t *testing.T, old wake.Waiter, cancel context.CancelFunc, b, c *process) (wake.Waiter, *process, error) {
				cancel()
				return subscribe(t, c.hub, dev(1)), c, context.Canceled
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, prefix := sharedRedis(t)
			// A long round keeps the abandoned BRPOP blocked throughout.
			cfg := wredis.Config{Prefix: prefix, Round: 5 * time.Second}
			a := newProcess(t, raw, 4, cfg)
			b := newProcess(t, raw, 4, cfg)
			c := newProcess(t, raw, 4, cfg)
			admin := adminClient(t, raw)
			k := dev(1)

			old := subscribe(t, b.hub, k)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			oldGot := waitAsync(ctx, old)
			waitBlocked(t, admin, b.name, 1)

			next, on, want := tt.leave(t, old, cancel, b, c)
			if err := receive(t, oldGot, time.Second, "old poll"); !errors.Is(err, want) {
				t.Fatalf("old Wait = %v, want %v", err, want)
			}
			if !on.hub.Held(k) {
				t.Fatal("Held = false for the new poll")
			}
			old.Close()
			if !on.hub.Held(k) {
				t.Fatal("closing the old waiter unregistered the new one")
			}

			// The new poll's BRPOP queues behind the old, abandoned one,
			// which Redis serves first.
			got := waitAsync(context.Background(), next)
			waitBlocked(t, admin, on.name, 1)
			if on != b {
				waitBlocked(t, admin, b.name, 1) // the old one is still there
			} else {
				waitBlocked(t, admin, b.name, 2)
			}
			signal(t, a.hub, k)
			// Guard: the hand-back. With the abandoned BRPOP's item
			// dropped instead of pushed back, this went red in both cases:
			// the new poll slept to its timeout.
			if err := receive(t, got, 4*time.Second, "new poll"); err != nil {
				t.Fatalf("new Wait = %v, want nil (wake eaten by the abandoned BRPOP)", err)
			}
		})
	}
}

func TestCtxCancelFreesAtOnce(t *testing.T) {
	raw, prefix := sharedRedis(t)
	p := newProcess(t, raw, 4, wredis.Config{Prefix: prefix})
	admin := adminClient(t, raw)
	k := dev(1)
	w := subscribe(t, p.hub, k)
	ctx, cancel := context.WithCancel(context.Background())
	got := waitAsync(ctx, w)
	waitBlocked(t, admin, p.name, 1)
	cancel()
	if err := receive(t, got, time.Second, "cancelled poll"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
	w.Close()
	if p.hub.Held(k) {
		t.Fatal("Held = true after Close")
	}
}

func TestHubClose(t *testing.T) {
	raw, prefix := sharedRedis(t)
	round := 2 * time.Second
	p := newProcess(t, raw, 8, wredis.Config{Prefix: prefix, Round: round})
	admin := adminClient(t, raw)
	var waits []<-chan error
	for i := range 3 {
		waits = append(waits, waitAsync(context.Background(), subscribe(t, p.hub, dev(i))))
	}
	waitBlocked(t, admin, p.name, 3)

	closed := make(chan error, 1)
	start := time.Now()
	go func() { closed <- p.hub.Close() }()
	for i, ch := range waits {
		if err := receive(t, ch, time.Second, "draining poll"); !errors.Is(err, wake.ErrClosed) {
			t.Fatalf("Wait %d = %v, want ErrClosed", i, err)
		}
	}
	// Close itself waits for the abandoned BRPOPs' rounds to end.
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(round + 5*time.Second):
		t.Fatalf("Close did not return within its round (%v) plus slack", round)
	}
	t.Logf("Close returned after %v", time.Since(start))

	w, err := p.hub.Subscribe(context.Background(), dev(9))
	if !errors.Is(err, wake.ErrClosed) || w != nil {
		t.Fatalf("Subscribe after Close = %v, %v; want nil, ErrClosed", w, err)
	}
	if err := p.hub.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// A store stand-in: envelopes committed per device, so a test can check
// that a poll sees what was sent, whichever way it woke.
type store struct{ committed [16]atomic.Int64 }

// poll runs a held poll's loop on its waiter until it has seen want
// envelopes for device i or budget runs out, re-reading after every wake
// (real or spurious) as the relay does. It returns how many wakes it took.
func (s *store) poll(w wake.Waiter, i int, want int64, budget time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	for wakes := 0; ; wakes++ {
		if s.committed[i].Load() >= want {
			return wakes, nil
		}
		if err := w.Wait(ctx); err != nil {
			return wakes, err
		}
	}
}

// Redis stopped under held polls: sends fail fast, polls fall back to
// one-second polling and still see every envelope; once Redis is back,
// wake-ups are immediate again.
func TestRedisOutage(t *testing.T) {
	srv := servicetest.StartRedis(t)
	retry := time.Second
	cfg := wredis.Config{Prefix: "fn:wake:", Retry: retry, Round: time.Second}
	a := newProcess(t, srv.URL(), 4, cfg)
	b := newProcess(t, srv.URL(), 8, cfg)
	admin := adminClient(t, srv.URL())
	var st store

	// Held polls, blocked in BRPOP.
	var held []wake.Waiter
	var waits []<-chan error
	for i := range 3 {
		w := subscribe(t, b.hub, dev(i))
		held = append(held, w)
		waits = append(waits, waitAsync(context.Background(), w))
	}
	waitBlocked(t, admin, b.name, 3)

	srv.Stop()
	for i, ch := range waits {
		if err := receive(t, ch, retry+5*time.Second, "held poll after Redis stopped"); err != nil {
			t.Fatalf("held Wait %d = %v, want nil (a spurious wake)", i, err)
		}
	}

	// A send commits, and its wake fails fast.
	st.committed[0].Add(1)
	start := time.Now()
	err := a.hub.Signal(context.Background(), wakes(dev(0)))
	if err == nil {
		t.Fatal("Signal with Redis down = nil, want an error")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Signal with Redis down took %v; a send must not hang on Redis", d)
	}
	t.Logf("Signal with Redis down failed after %v: %v", time.Since(start), err)

	// The poll still sees the envelope, by polling.
	if _, err := st.poll(held[0], 0, 1, retry+5*time.Second); err != nil {
		t.Fatalf("poll during outage: %v", err)
	}
	// And keeps polling: each Wait is a spurious wake after about Retry.
	for i := range 3 {
		start := time.Now()
		if err := waitFor(held[1], retry+5*time.Second); err != nil {
			t.Fatalf("Wait %d during outage = %v, want nil", i, err)
		}
		if d := time.Since(start); d < retry/2 {
			t.Fatalf("Wait %d during outage returned after %v; want about Retry (%v), not a busy loop", i, d, retry)
		}
	}

	srv.Start()
	// Recovery: a poll's wait is blocked in Redis again, rather than
	// failing into spurious wakes. Keep one waiting until it is.
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithCancel(context.Background())
		got := waitAsync(ctx, held[2])
		n, _ := blockedWithin(admin, b.name, 1, 2*time.Second)
		cancel()
		if err := receive(t, got, time.Second, "poll while Redis recovers"); err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait while Redis recovers = %v", err)
		}
		if n >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("waits still failing 15s after Redis came back")
		}
	}
	// And wake-ups are immediate again, across processes.
	for i := range 5 {
		got := waitAsync(context.Background(), held[2])
		waitBlocked(t, admin, b.name, 1)
		st.committed[2].Add(1)
		signal(t, a.hub, dev(2))
		if err := receive(t, got, time.Second, "wake after recovery"); err != nil {
			t.Fatalf("Wait %d after recovery = %v, want nil", i, err)
		}
	}
}

// The pool is this mode's held-poll ceiling. Past it, waits still work,
// only slower (pool timeouts count as failed waits): every poll sees its
// envelope within a bounded time. Two idle polls, for devices that get
// nothing, take the pool's two connections first and keep taking them back
// round after round; eight more polls then wait for envelopes.
func TestPoolExhausted(t *testing.T) {
	raw, prefix := sharedRedis(t)
	cfg := wredis.Config{Prefix: prefix, Round: time.Second}
	a := newProcess(t, raw, 4, cfg)
	b := newProcess(t, raw, 2, cfg)
	admin := adminClient(t, raw)
	const (
		idle   = 2
		polls  = 8
		budget = 30 * time.Second
	)
	var st store

	idleCtx, stopIdle := context.WithCancel(context.Background())
	var idleDone sync.WaitGroup
	for i := range idle {
		w := subscribe(t, b.hub, dev(100+i))
		idleDone.Go(func() {
			for w.Wait(idleCtx) == nil {
			}
		})
	}
	defer idleDone.Wait()
	defer stopIdle()
	waitBlocked(t, admin, b.name, idle) // the pool is full

	type result struct {
		wakes int
		took  time.Duration
		err   error
	}
	results := make(chan result, polls)
	start := time.Now()
	for i := range polls {
		w := subscribe(t, b.hub, dev(i))
		go func() {
			wakes, err := st.poll(w, i, 1, budget)
			results <- result{wakes, time.Since(start), err}
		}()
	}
	for i := range polls {
		st.committed[i].Add(1)
		signal(t, a.hub, dev(i))
	}
	var slowest time.Duration
	for range polls {
		r := <-results
		if r.err != nil {
			t.Fatalf("poll = %v after %d wakes; want its envelope within %v", r.err, r.wakes, budget)
		}
		slowest = max(slowest, r.took)
	}
	t.Logf("%d polls behind %d idle ones on a pool of 2: slowest saw its envelope after %v", polls, idle, slowest)
}
