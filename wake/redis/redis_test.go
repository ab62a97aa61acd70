package redis_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/wake"
	wredis "github.com/flamenet/relay/wake/redis"
)

// steady is a config for tests of the message path: a heartbeat bound so
// generous that a loaded machine never makes the hub unhealthy, so any
// fallback round in these tests means a wake was lost, not a slow test.
func steady(prefix string) wredis.Config {
	return wredis.Config{Prefix: prefix, HeartbeatTimeout: 30 * time.Second}
}

// Two hubs on one Redis are two relay processes: a send on A wakes a poll
// held on B, with the head, told to B's observer before B's waiter wakes;
// a removal on A ends B's poll; A does not act twice on its own messages.
func TestWakesCrossRelays(t *testing.T) {
	raw, prefix := sharedRedis(t)
	a := newProcess(t, raw, 4, steady(prefix))
	b := newProcess(t, raw, 4, steady(prefix))
	k := dev(1)

	w := subscribe(t, b.hub, k)
	if !b.hub.Held(k) || a.hub.Held(k) {
		t.Fatalf("Held: b=%v a=%v, want true false", b.hub.Held(k), a.hub.Held(k))
	}
	got := waitAsync(context.Background(), w)
	if err := a.hub.Signal(context.Background(), wakes(7, k)); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if err := receive(t, got, 2*time.Second, "cross-relay wake"); err != nil {
		t.Fatalf("Wait = %v, want nil", err)
	}
	if h := b.obs.head(k); h != 7 {
		t.Fatalf("B's observer has head %d when the waiter woke, want 7", h)
	}

	// A send on the poll's own process wakes it directly.
	got = waitAsync(context.Background(), w)
	if err := b.hub.Signal(context.Background(), wakes(8, k)); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if err := receive(t, got, 2*time.Second, "same-relay wake"); err != nil {
		t.Fatalf("Wait = %v, want nil", err)
	}

	// A listens only for what it holds: k2, not k. B's wake of k2 reaches
	// it; its own wake of k travelled on a channel it does not listen to.
	k2 := dev(2)
	w2 := subscribe(t, a.hub, k2)
	if err := b.hub.Signal(context.Background(), wakes(3, k2)); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	eventually(t, 2*time.Second, "A hears B's wake", func() bool { return a.obs.head(k2) == 3 })
	if n := a.obs.calls(k); n != 1 {
		t.Fatalf("A's observer heard k %d times, want 1 (its own Signal)", n)
	}
	if n := b.counter(t, "fn_redis_wakeups_received_total"); n != 1 {
		t.Fatalf("B received %v wakes from other relays, want 1", n)
	}
	if got, unheld := a.counter(t, "fn_redis_wakeups_received_total"), a.counter(t, "fn_redis_wakeups_unheld_total"); got != 1 || unheld != 0 {
		t.Fatalf("A received %v wakes, %v of them for devices it does not hold; want 1 and 0", got, unheld)
	}
	// Its poll gone, A still listens for k2 for the linger, and counts
	// what it hears as unheld.
	w2.Close()
	if err := b.hub.Signal(context.Background(), wakes(4, k2)); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	eventually(t, 2*time.Second, "A hears B's wake while it lingers", func() bool { return a.obs.head(k2) == 4 })
	if got, unheld := a.counter(t, "fn_redis_wakeups_received_total"), a.counter(t, "fn_redis_wakeups_unheld_total"); got != 2 || unheld != 1 {
		t.Fatalf("A received %v wakes, %v of them for devices it does not hold; want 2 and 1", got, unheld)
	}
	if n := b.counter(t, "fn_redis_wakeups_unheld_total"); n != 0 {
		t.Fatalf("B received %v wakes for devices it does not hold, want 0", n)
	}

	// A removal on A ends B's poll with ErrRemoved, B's observer first.
	k3 := dev(3)
	w3 := subscribe(t, b.hub, k3)
	got = waitAsync(context.Background(), w3)
	at := time.Unix(1700000000, 123456789)
	if err := a.hub.Remove(context.Background(), k3, at); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if err := receive(t, got, 2*time.Second, "removed poll"); !errors.Is(err, wake.ErrRemoved) {
		t.Fatalf("Wait = %v, want ErrRemoved", err)
	}
	if got := b.obs.removedAt(k3); !got.Equal(at) {
		t.Fatalf("B's observer: removed at %v, want %v", got, at)
	}
	if b.obs.rounds() != 0 || a.obs.rounds() != 0 {
		t.Fatalf("fallback rounds: a %d b %d, want none on a healthy Redis", a.obs.rounds(), b.obs.rounds())
	}
}

// A Signal with many recipients publishes one message per device, in one
// pipeline, and a relay hears the devices it holds and no other.
func TestSignalOneMessagePerDevice(t *testing.T) {
	raw, prefix := sharedRedis(t)
	a := newProcess(t, raw, 4, steady(prefix))
	b := newProcess(t, raw, 4, steady(prefix))
	pc := countPublishes(a.client)

	const n = 64
	var ws []wake.Wake
	for i := range n {
		ws = append(ws, wake.Wake{Key: dev(i), Head: int64(100 + i)})
		if i%2 == 1 {
			defer subscribe(t, b.hub, dev(i)).Close()
		}
	}
	if err := a.hub.Signal(context.Background(), ws); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if pipes, pubs := pc.get('V'); pipes != 1 || pubs != n {
		t.Fatalf("Signal to %d devices: %d pipelines, %d publishes; want 1 and %d", n, pipes, pubs, n)
	}
	// The last device is held: once B heard it, it heard all it ever will.
	for i := 1; i < n; i += 2 {
		eventually(t, 2*time.Second, fmt.Sprint("B hears dev ", i), func() bool { return b.obs.head(dev(i)) == int64(100+i) })
	}
	for i := 0; i < n; i += 2 {
		if h := b.obs.head(dev(i)); h != 0 {
			t.Errorf("B heard dev %d (head %d), which it does not hold", i, h)
		}
	}
	if got, unheld := b.counter(t, "fn_redis_wakeups_received_total"), b.counter(t, "fn_redis_wakeups_unheld_total"); got != n/2 || unheld != 0 {
		t.Fatalf("B received %v wakes, %v unheld; want %d and 0", got, unheld, n/2)
	}
}

// TestNoLostWakeup is the hub's lost-wake-up invariant in steady state: a
// wake published after Subscribe (and the poll's store read) and before
// Wait wakes the poll, by the message: B's observer has the head when the
// Wait returns and no fallback round ran. Signals come from another hub,
// so the local fast path cannot hide a lost wake.
//
// Guard: registration at Subscribe. Broken on purpose once, with the local
// registration moved into the first Wait (a waiter that only "listens"
// once it waits), this went red at once: "device 2 iteration 0: Wait =
// context deadline exceeded, want nil (wake lost)", on every device.
func TestNoLostWakeup(t *testing.T) {
	raw, prefix := sharedRedis(t)
	a := newProcess(t, raw, 8, steady(prefix))
	b := newProcess(t, raw, 8, steady(prefix))
	const (
		devices    = 4
		iterations = 300
	)
	var wg sync.WaitGroup
	for d := range devices {
		wg.Go(func() {
			k := dev(d)
			for i := range iterations {
				head := int64(i + 1)
				w, err := b.hub.Subscribe(context.Background(), k)
				if err != nil {
					t.Errorf("Subscribe: %v", err)
					return
				}
				// Here the poll would read the store and find nothing.
				if err := a.hub.Signal(context.Background(), wakes(head, k)); err != nil {
					w.Close()
					t.Errorf("Signal: %v", err)
					return
				}
				err = waitFor(w, 2*time.Second)
				got := b.obs.head(k)
				w.Close()
				if err != nil {
					t.Errorf("device %d iteration %d: Wait = %v, want nil (wake lost)", d, i, err)
					return
				}
				if got < head {
					t.Errorf("device %d iteration %d: observer has head %d when the waiter woke, want %d", d, i, got, head)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := b.obs.rounds(); n != 0 {
		t.Fatalf("%d fallback rounds: wakes came by re-reads, not messages", n)
	}
}

// The observer hears a wake or a removal from another relay before the
// waiter wakes or ends, so a woken poll finds the news in memory. The
// observer here is slow (a few milliseconds per call), which makes a wrong
// order show every time rather than now and then.
//
// Guard: the order in the receive path. Broken on purpose once
// (local.Notify before Observer.Advanced), this went red on the first
// iteration: "observer has head 0 when the waiter woke, want 1". The plain
// TestNoLostWakeup caught the same break in one run of three.
func TestObserverBeforeWaiter(t *testing.T) {
	raw, prefix := sharedRedis(t)
	a := newProcess(t, raw, 4, steady(prefix))
	b := newClient(t, raw, 4)
	b.obsDelay = 5 * time.Millisecond
	b.start(t, steady(prefix))
	for i := range 10 {
		k := dev(i)
		w := subscribe(t, b.hub, k)
		got := waitAsync(context.Background(), w)
		if err := a.hub.Signal(context.Background(), wakes(1, k)); err != nil {
			t.Fatal(err)
		}
		if err := receive(t, got, 2*time.Second, "poll"); err != nil {
			t.Fatalf("Wait = %v", err)
		}
		if h := b.obs.head(k); h != 1 {
			t.Fatalf("iteration %d: observer has head %d when the waiter woke, want 1", i, h)
		}
		got = waitAsync(context.Background(), w)
		at := time.Unix(1700000000+int64(i), 0)
		if err := a.hub.Remove(context.Background(), k, at); err != nil {
			t.Fatal(err)
		}
		if err := receive(t, got, 2*time.Second, "poll"); !errors.Is(err, wake.ErrRemoved) {
			t.Fatalf("Wait = %v, want ErrRemoved", err)
		}
		if r := b.obs.removedAt(k); !r.Equal(at) {
			t.Fatalf("iteration %d: observer has removal %v when the waiter ended, want %v", i, r, at)
		}
	}
}

// TestNoLostWakeupAtStart: a relay that has just started, with a poll
// registered at once and a send on another relay right after, wakes the
// poll by the message. New returns only once its subscriptions are
// confirmed.
//
// Guard: the confirmation wait in New. Broken on purpose once (New
// returned as soon as the subscriber goroutine was started), this went red
// in four runs of four on the second iteration (the first still dials
// slowly enough): "head 0 and 1 rounds; want 2 and 0 (woken by a round,
// not the message)". The wake was published before the subscription; only
// the round that a late confirmation runs saved the poll.
func TestNoLostWakeupAtStart(t *testing.T) {
	raw, prefix := sharedRedis(t)
	a := newProcess(t, raw, 4, steady(prefix))
	b := newClient(t, raw, 4)
	k := dev(1)
	for i := range 30 {
		head := int64(i + 1)
		p := &process{name: b.name, client: b.client}
		p.start(t, steady(prefix))
		w := subscribe(t, p.hub, k)
		if err := a.hub.Signal(context.Background(), wakes(head, k)); err != nil {
			t.Fatalf("Signal: %v", err)
		}
		err := waitFor(w, 2*time.Second)
		got, rounds := p.obs.head(k), p.obs.rounds()
		w.Close()
		_ = p.hub.Close()
		if err != nil {
			t.Fatalf("iteration %d: Wait = %v (wake published before the subscription)", i, err)
		}
		if got != head || rounds != 0 {
			t.Fatalf("iteration %d: head %d and %d rounds; want %d and 0 (woken by a round, not the message)", i, got, rounds, head)
		}
	}
}

// A held poll holds no Redis connection: 2,000 waiters on one hub leave
// the server's client count where it was, and the hub's own connections
// stay at the subscriber plus the publish pool.
func TestHeldPollsHoldNoConnection(t *testing.T) {
	srv := servicetest.StartRedis(t)
	admin := adminClient(t, srv.URL())
	const pool, n = 4, 2000
	a := newProcess(t, srv.URL(), pool, wredis.Config{})
	b := newProcess(t, srv.URL(), pool, wredis.Config{})
	// Warm both publish pools, two publishes at a time, so that "before"
	// counts what they open: the holding hub publishes new devices'
	// presences beside its heartbeats.
	var warm sync.WaitGroup
	for g := range 2 {
		warm.Go(func() {
			for i := range 20 {
				_ = a.hub.Signal(context.Background(), wakes(1, dev(10000+100*g+i)))
				_ = b.hub.Signal(context.Background(), wakes(1, dev(10000+100*g+i)))
			}
		})
	}
	warm.Wait()
	before := connectedClients(t, admin)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	results := make(chan error, n)
	for i := range n {
		w := subscribe(t, b.hub, dev(i))
		go func() { results <- w.Wait(ctx) }()
	}
	held := connectedClients(t, admin)
	mine := connections(t, admin, b.name, "")
	t.Logf("connected_clients: %d before, %d with %d polls held; the holding hub's own connections: %d", before, held, n, mine)
	if held != before {
		t.Fatalf("connected_clients went from %d to %d with %d held polls", before, held, n)
	}
	if mine > 1+pool {
		t.Fatalf("the hub holding %d polls has %d connections, want at most %d (subscriber + pool)", n, mine, 1+pool)
	}
	if subs := connections(t, admin, b.name, "subscribe"); subs != 1 {
		t.Fatalf("%d subscriber connections, want 1", subs)
	}

	// Every one of them is woken from the other relay, 64 to a send.
	for i := 0; i < n; i += 64 {
		var keys []device.Key
		for j := i; j < min(i+64, n); j++ {
			keys = append(keys, dev(j))
		}
		if err := a.hub.Signal(context.Background(), wakes(1, keys...)); err != nil {
			t.Fatalf("Signal: %v", err)
		}
	}
	for range n {
		if err := receive(t, results, 10*time.Second, "held poll"); err != nil {
			t.Fatalf("Wait = %v, want nil", err)
		}
	}
	if after := connectedClients(t, admin); after > before+pool {
		t.Fatalf("connected_clients %d after the sends, want at most %d", after, before+pool)
	}
}

// A newer poll for the same device on one process supersedes the older.
func TestSupersede(t *testing.T) {
	raw, prefix := sharedRedis(t)
	a := newProcess(t, raw, 4, steady(prefix))
	b := newProcess(t, raw, 4, steady(prefix))
	k := dev(1)
	old := subscribe(t, b.hub, k)
	oldGot := waitAsync(context.Background(), old)
	next := subscribe(t, b.hub, k)
	if err := receive(t, oldGot, time.Second, "old poll"); !errors.Is(err, wake.ErrSuperseded) {
		t.Fatalf("old Wait = %v, want ErrSuperseded", err)
	}
	old.Close()
	if !b.hub.Held(k) {
		t.Fatal("closing the old waiter unregistered the new one")
	}
	got := waitAsync(context.Background(), next)
	if err := a.hub.Signal(context.Background(), wakes(1, k)); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, got, 2*time.Second, "new poll"); err != nil {
		t.Fatalf("new Wait = %v, want nil", err)
	}
}

// Close ends every held poll at once and refuses new ones; a send that
// finishes after Close still reaches the other relays.
func TestHubClose(t *testing.T) {
	raw, prefix := sharedRedis(t)
	a := newProcess(t, raw, 4, steady(prefix))
	b := newProcess(t, raw, 4, steady(prefix))
	var waits []<-chan error
	for i := range 3 {
		waits = append(waits, waitAsync(context.Background(), subscribe(t, a.hub, dev(i))))
	}
	closed := make(chan error, 1)
	go func() { closed <- a.hub.Close() }()
	for i, ch := range waits {
		if err := receive(t, ch, time.Second, "draining poll"); !errors.Is(err, wake.ErrClosed) {
			t.Fatalf("Wait %d = %v, want ErrClosed", i, err)
		}
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	w, err := a.hub.Subscribe(context.Background(), dev(9))
	if !errors.Is(err, wake.ErrClosed) || w != nil {
		t.Fatalf("Subscribe after Close = %v, %v; want nil, ErrClosed", w, err)
	}
	if err := a.hub.Health(); !errors.Is(err, wake.ErrClosed) {
		t.Fatalf("Health after Close = %v, want ErrClosed", err)
	}
	got := waitAsync(context.Background(), subscribe(t, b.hub, dev(5)))
	if err := a.hub.Signal(context.Background(), wakes(1, dev(5))); err != nil {
		t.Fatalf("Signal after Close: %v", err)
	}
	if err := receive(t, got, 2*time.Second, "poll on the other relay"); err != nil {
		t.Fatalf("Wait = %v", err)
	}
	if err := a.hub.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// Degrade forces fallback rounds until its time, then one more.
func TestDegrade(t *testing.T) {
	raw, prefix := sharedRedis(t)
	cfg := steady(prefix)
	cfg.FallbackInterval = 200 * time.Millisecond
	p := newProcess(t, raw, 4, cfg)
	if err := p.hub.Health(); err != nil {
		t.Fatalf("Health = %v, want nil", err)
	}
	w := subscribe(t, p.hub, dev(1))
	p.hub.Degrade(time.Now().Add(time.Second))
	if err := p.hub.Health(); err == nil {
		t.Fatal("Health = nil while degraded")
	}
	// Rounds wake the held poll, again and again.
	for i := range 3 {
		if err := waitFor(w, 2*time.Second); err != nil {
			t.Fatalf("Wait %d while degraded = %v, want a round's wake", i, err)
		}
	}
	eventually(t, 5*time.Second, "healthy after Degrade", func() bool { return p.hub.Health() == nil })
	eventually(t, 2*time.Second, "a recovery round", func() bool { return p.counter(t, "fn_redis_fallback_rounds_total", "recovered") == 1 })
	if n := p.counter(t, "fn_redis_fallback_rounds_total", "degraded"); n < 3 {
		t.Fatalf("%v degraded rounds, want at least 3", n)
	}
}

// TestFleetsApart: Redis's pub/sub channels are the whole server's,
// whatever database a client selected, so two fleets on one Redis woke
// each other's polls. Hubs whose URLs name other databases, or that have
// other prefixes, hear nothing of each other; hubs on the same database
// with the same prefix do. Red while the channels ignored the database.
func TestFleetsApart(t *testing.T) {
	raw, prefix := sharedRedis(t)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u.Query().Has("cluster") || u.Query().Has("master_name") || u.Scheme == "unix" {
		t.Skip("needs a single Redis whose URL names the database in its path")
	}
	onDB := func(db int) string {
		v := *u
		v.Path = fmt.Sprintf("/%d", db)
		return v.String()
	}
	a := newProcess(t, onDB(1), 2, steady(prefix))
	same := newProcess(t, onDB(1), 2, steady(prefix))
	otherDB := newProcess(t, onDB(2), 2, steady(prefix))
	otherPrefix := newProcess(t, onDB(1), 2, steady(prefix+"other:"))
	k := dev(1)
	got := waitAsync(context.Background(), subscribe(t, same.hub, k))
	for _, p := range []*process{otherDB, otherPrefix} {
		subscribe(t, p.hub, k)
	}
	if err := a.hub.Signal(context.Background(), wakes(5, k)); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if err := receive(t, got, 2*time.Second, "the same fleet's wake"); err != nil {
		t.Fatalf("Wait = %v, want nil", err)
	}
	// What reached one subscriber has had time to reach the others.
	time.Sleep(300 * time.Millisecond)
	if h := otherDB.obs.head(k); h != 0 {
		t.Errorf("a hub on another database heard the wake (head %d); channels %q and %q", h, a.hub.Channels()[0], otherDB.hub.Channels()[0])
	}
	if h := otherPrefix.obs.head(k); h != 0 {
		t.Errorf("a hub with another prefix heard the wake (head %d)", h)
	}
}
