package redis_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/wake"
	wredis "github.com/flamenet/relay/wake/redis"
)

// stream is a store stand-in under a stream of sends: it commits to
// devices in turn and signals each commit through a hub, while a poll
// loop per device, on another hub, re-reads after every wake (real or a
// fallback round) as the relay does. It records how long each commit took
// to be seen.
type stream struct {
	devices   int
	committed []atomic.Int64
	mu        sync.Mutex
	at        [][]time.Time // at[d][v-1]: when device d's value v committed
	worst     time.Duration
	seen      []atomic.Int64
}

func newStream(devices int) *stream {
	return &stream{devices: devices, committed: make([]atomic.Int64, devices), at: make([][]time.Time, devices), seen: make([]atomic.Int64, devices)}
}

// poll runs device d's poll loop on w until ctx ends.
func (s *stream) poll(ctx context.Context, w wake.Waiter, d int) {
	for {
		v := s.committed[d].Load()
		if old := s.seen[d].Load(); v > old {
			now := time.Now()
			s.mu.Lock()
			for x := old + 1; x <= v; x++ {
				s.worst = max(s.worst, now.Sub(s.at[d][x-1]))
			}
			s.mu.Unlock()
			s.seen[d].Store(v)
		}
		if err := w.Wait(ctx); err != nil {
			return
		}
	}
}

// send commits the next value for device d and signals it through h.
func (s *stream) send(h wake.Hub, d int) {
	s.mu.Lock()
	s.at[d] = append(s.at[d], time.Now())
	v := int64(len(s.at[d]))
	s.committed[d].Store(v)
	s.mu.Unlock()
	_ = h.Signal(context.Background(), wakes(v, dev(d))) // failures are the point
}

// run sends to the devices in turn every interval until ctx ends.
func (s *stream) run(ctx context.Context, h wake.Hub, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.send(h, i%s.devices)
	}
}

// caughtUp waits until every poll has seen every commit.
func (s *stream) caughtUp(tb testing.TB, within time.Duration) {
	tb.Helper()
	eventually(tb, within, "every commit seen", func() bool {
		for d := range s.devices {
			if s.seen[d].Load() != s.committed[d].Load() {
				return false
			}
		}
		return true
	})
}

func (s *stream) worstDelay() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.worst
}

// holdPolls starts the stream's poll loops on h; they end with the test.
func (s *stream) holdPolls(t *testing.T, h wake.Hub) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for d := range s.devices {
		w := subscribe(t, h, dev(d))
		wg.Go(func() { s.poll(ctx, w, d) })
	}
}

// messagePathWorks: a wake sent through a now reaches b's observer by a
// message (a round never sets a head) within d. It takes d when it fails.
func messagePathWorks(a, b *process, k device.Key, head int64, d time.Duration) bool {
	deadline := time.Now().Add(d)
	// b listens for what it holds.
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	w, err := b.hub.Subscribe(ctx, k)
	cancel()
	if err != nil {
		return false
	}
	defer w.Close()
	// Only a confirmed subscription hears messages: one confirmed late
	// (a Redis coming back) would miss a wake sent before it.
	for !b.hub.Hears(k) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of the hub
	}
	sent := a.hub.Signal(context.Background(), wakes(head, k)) == nil
	for time.Now().Before(deadline) {
		if sent && b.obs.head(k) >= head {
			return true
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of the observer
	}
	return false
}

// awaitMessages returns how long after since the message path from a to
// b works again, failing the test after within.
func awaitMessages(t *testing.T, a, b *process, since time.Time, within time.Duration) time.Duration {
	t.Helper()
	probe := device.Key{Household: "probe", Device: "probe"}
	for head := b.obs.head(probe) + 1; ; head++ {
		if messagePathWorks(a, b, probe, head, 100*time.Millisecond) {
			return time.Since(since)
		}
		if time.Since(since) > within {
			t.Fatalf("no wake by message within %v", within)
		}
	}
}

// Redis killed and restarted under a stream of sends: every commit is seen
// (by the message or a fallback round) within the fallback interval and a
// margin, and wakes travel by message again within 2 s of Redis's return.
func TestRedisRestart(t *testing.T) {
	srv := servicetest.StartRedis(t)
	cfg := wredis.Config{}
	a := newProcess(t, srv.URL(), 4, cfg)
	b := newProcess(t, srv.URL(), 4, cfg)
	s := newStream(8)
	s.holdPolls(t, b.hub)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.run(ctx, a.hub, 10*time.Millisecond) })
	defer func() { stop(); wg.Wait() }()

	awaitMessages(t, a, b, time.Now(), 5*time.Second)
	srv.Stop()
	eventually(t, 3*time.Second, "B unhealthy", func() bool { return b.hub.Health() != nil })
	time.Sleep(2 * time.Second) // the outage, under the stream of sends
	srv.Start()
	back := time.Now()
	took := awaitMessages(t, a, b, back, 10*time.Second)
	t.Logf("wakes by message again %v after Redis came back", took)
	if took > 2*time.Second {
		t.Fatalf("wakes by message again only %v after Redis came back, want within 2s", took)
	}
	time.Sleep(500 * time.Millisecond) // more sends with Redis back
	stop()
	wg.Wait()
	s.caughtUp(t, wredis.DefaultFallbackInterval+3*time.Second)
	worst := s.worstDelay()
	t.Logf("slowest commit seen after %v; A: %v publish errors, %v breaker skips; B: %v reconnects, rounds %v unhealthy %v recovered %v resubscribed %v peer",
		worst, a.counter(t, "fn_redis_publish_errors_total"), a.counter(t, "fn_redis_breaker_skips_total"),
		b.counter(t, "fn_redis_subscriber_reconnects_total"), b.counter(t, "fn_redis_fallback_rounds_total", "unhealthy"),
		b.counter(t, "fn_redis_fallback_rounds_total", "recovered"), b.counter(t, "fn_redis_fallback_rounds_total", "resubscribed"),
		b.counter(t, "fn_redis_fallback_rounds_total", "peer"))
	if bound := wredis.DefaultFallbackInterval + 2*time.Second; worst > bound {
		t.Fatalf("a commit was seen only %v after it, want within %v", worst, bound)
	}
	if b.counter(t, "fn_redis_fallback_rounds_total", "unhealthy") == 0 {
		t.Fatal("no fallback round during the outage")
	}
}

// The subscriber connections cut (CLIENT KILL TYPE pubsub) while the other
// hub signals: the waiter still wakes within the fallback interval and a
// margin, and the hub subscribes again.
func TestSubscriberKilled(t *testing.T) {
	srv := servicetest.StartRedis(t)
	admin := adminClient(t, srv.URL())
	a := newProcess(t, srv.URL(), 4, wredis.Config{})
	b := newProcess(t, srv.URL(), 4, wredis.Config{})
	for i := range 5 {
		k := dev(i)
		w := subscribe(t, b.hub, k)
		got := waitAsync(context.Background(), w)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := admin.Do(ctx, "client", "kill", "type", "pubsub").Int()
		cancel()
		if err != nil || n < 2 {
			l, _ := admin.ClientList(context.Background()).Result()
			t.Fatalf("iteration %d: CLIENT KILL TYPE pubsub = %d, %v; want both hubs' subscribers\n%s", i, n, err, l)
		}
		_ = a.hub.Signal(context.Background(), wakes(1, k))
		if err := receive(t, got, wredis.DefaultFallbackInterval+time.Second, "poll after the subscriber was cut"); err != nil {
			t.Fatalf("Wait = %v", err)
		}
		// Healthy on a new session: a hub that has not yet noticed the
		// kill is healthy on its old one.
		eventually(t, 5*time.Second, "subscribed again", func() bool {
			for _, p := range []*process{a, b} {
				if p.counter(t, "fn_redis_subscriber_reconnects_total") < float64(i+1) || p.hub.Health() != nil {
					return false
				}
			}
			return true
		})
	}
	if !messagePathWorks(a, b, dev(99), 1, 2*time.Second) {
		t.Fatal("no wake by message after the reconnects")
	}
}

// Redis paused (SIGSTOP): connections stay open and nothing answers. The
// hub turns unhealthy within about HeartbeatTimeout and runs fallback
// rounds; Signal returns within PublishTimeout, and once the breaker is
// open returns at once without touching Redis. After SIGCONT all is well.
func TestRedisPaused(t *testing.T) {
	srv := servicetest.StartRedis(t)
	a := newProcess(t, srv.URL(), 4, wredis.Config{})
	b := newProcess(t, srv.URL(), 4, wredis.Config{})
	pc := countPublishes(a.client)
	w := subscribe(t, b.hub, dev(1))
	if !messagePathWorks(a, b, dev(2), 1, 2*time.Second) {
		t.Fatal("no wake by message before the pause")
	}

	srv.Pause()
	paused := time.Now()
	defer srv.Resume() // before the cleanup kills it, harmless if resumed
	start := time.Now()
	err := a.hub.Signal(context.Background(), wakes(1, dev(1)))
	took := time.Since(start)
	t.Logf("Signal into the paused Redis: %v after %v", err, took)
	if err == nil {
		t.Fatal("Signal into a paused Redis = nil, want a timeout")
	}
	if bound := wredis.DefaultPublishTimeout + 250*time.Millisecond; took > bound {
		t.Fatalf("Signal took %v, want within %v", took, bound)
	}

	eventually(t, 3*time.Second, "B unhealthy", func() bool { return b.hub.Health() != nil })
	unhealthyAfter := time.Since(paused)
	t.Logf("B unhealthy %v after the pause: %v", unhealthyAfter, b.hub.Health())
	if bound := wredis.DefaultHeartbeatTimeout + 500*time.Millisecond; unhealthyAfter > bound {
		t.Fatalf("unhealthy only %v after the pause, want within %v", unhealthyAfter, bound)
	}
	// Fallback rounds wake the held poll.
	for i := range 2 {
		if err := waitFor(w, wredis.DefaultFallbackInterval+time.Second); err != nil {
			t.Fatalf("Wait %d during the pause = %v, want a round's wake", i, err)
		}
	}

	// The breaker is open: Signal fails at once and sends nothing.
	eventually(t, 3*time.Second, "A unhealthy", func() bool { return a.hub.Health() != nil })
	_, before := pc.get('V')
	for range 10 {
		start := time.Now()
		err := a.hub.Signal(context.Background(), wakes(1, dev(3)))
		if !errors.Is(err, wredis.ErrBreakerOpen) {
			t.Fatalf("Signal with the breaker open = %v, want ErrBreakerOpen", err)
		}
		if d := time.Since(start); d > 50*time.Millisecond {
			t.Fatalf("Signal with the breaker open took %v", d)
		}
	}
	if _, after := pc.get('V'); after != before {
		t.Fatalf("Signal with the breaker open published %d wake messages", after-before)
	}
	if n := a.counter(t, "fn_redis_breaker_skips_total"); n < 10 {
		t.Fatalf("%v breaker skips counted, want 10", n)
	}
	// A few seconds of pause: three rounds, one each FallbackInterval.
	eventually(t, 5*time.Second, "three fallback rounds", func() bool {
		return b.counter(t, "fn_redis_fallback_rounds_total", "unhealthy") >= 3
	})
	t.Logf("resuming Redis after %v", time.Since(paused))

	srv.Resume()
	took = awaitMessages(t, a, b, time.Now(), 10*time.Second)
	t.Logf("wakes by message again %v after SIGCONT", took)
	eventually(t, 5*time.Second, "both healthy", func() bool { return a.hub.Health() == nil && b.hub.Health() == nil })
	eventually(t, time.Second, "a recovery round", func() bool {
		return b.counter(t, "fn_redis_fallback_rounds_total", "recovered") >= 1
	})
}

// New refuses settings Redis says are wrong, with an error that says so,
// and starts in fallback when Redis is merely away.
func TestStartChecks(t *testing.T) {
	secured := servicetest.StartRedis(t, "--requirepass", "right")
	open := servicetest.StartRedis(t)
	tests := []struct {
		name, url, want string
	}{
		{"wrong password", "redis://:wrong@" + secured.Addr() + "/0", "WRONGPASS"},
		{"no password", "redis://" + secured.Addr() + "/0", "NOAUTH"},
		{"database out of range", "redis://" + open.Addr() + "/99", "DB index is out of range"},
		{"host that does not resolve", "redis://no-such-host.invalid:6379/0", "no-such-host.invalid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newClient(t, tt.url, 2)
			err := p.tryStart(t, wredis.Config{})
			if err == nil {
				t.Fatalf("New with %s = nil error", tt.url)
			}
			if !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("New = %q, want one line mentioning %q", err, tt.want)
			}
		})
	}
	// The right password works.
	newProcess(t, "redis://:right@"+secured.Addr()+"/0", 2, wredis.Config{})
}

// A Redis that is down at start: New returns a hub that re-reads in
// rounds, and subscribes once Redis comes up.
func TestStartWhileRedisDown(t *testing.T) {
	srv := servicetest.StartRedis(t)
	srv.Stop()
	cfg := wredis.Config{FallbackInterval: 200 * time.Millisecond}
	start := time.Now()
	b := newProcess(t, srv.URL(), 2, cfg)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("New with Redis down took %v", d)
	}
	if err := b.hub.Health(); err == nil {
		t.Fatal("Health = nil with Redis down")
	}
	w := subscribe(t, b.hub, dev(1))
	for i := range 2 {
		if err := waitFor(w, 2*time.Second); err != nil {
			t.Fatalf("Wait %d with Redis down = %v, want a round's wake", i, err)
		}
	}
	if err := b.hub.Signal(context.Background(), wakes(1, dev(1))); !errors.Is(err, wredis.ErrBreakerOpen) {
		t.Fatalf("Signal with Redis down since start = %v, want ErrBreakerOpen", err)
	}

	srv.Start()
	eventually(t, 5*time.Second, "healthy once Redis is up", func() bool { return b.hub.Health() == nil })
	a := newProcess(t, srv.URL(), 2, cfg)
	if !messagePathWorks(a, b, dev(5), 1, 2*time.Second) {
		t.Fatal("no wake by message after Redis came up")
	}
	eventually(t, time.Second, "one recovery round", func() bool {
		return b.counter(t, "fn_redis_fallback_rounds_total", "recovered") == 1
	})
}

// A relay whose publishes failed tells the others once it can, and they
// run a round: a wake it could not publish still reaches a poll held on a
// relay whose own Redis connection never failed.
func TestLostWakesAnnounced(t *testing.T) {
	srv := servicetest.StartRedis(t)
	// A reaches Redis through a proxy that the test cuts; B directly.
	px := servicetest.NewProxy(t, srv.Addr())
	a := newProcess(t, "redis://"+px.Addr+"/0", 2, wredis.Config{})
	b := newProcess(t, srv.URL(), 2, wredis.Config{HeartbeatTimeout: 30 * time.Second})
	w := subscribe(t, b.hub, dev(1))
	got := waitAsync(context.Background(), w)

	px.Cut()
	eventually(t, 3*time.Second, "A unhealthy", func() bool { return a.hub.Health() != nil })
	if err := a.hub.Signal(context.Background(), wakes(1, dev(1))); err == nil {
		t.Fatal("Signal through a cut connection = nil")
	}
	select {
	case err := <-got:
		t.Fatalf("B's poll woke (%v) while A could not publish", err)
	default:
	}
	if n := b.obs.rounds(); n != 0 {
		t.Fatalf("B ran %d rounds though its own Redis is fine", n)
	}
	px.Restore()
	if err := receive(t, got, 5*time.Second, "B's poll after A came back"); err != nil {
		t.Fatalf("Wait = %v", err)
	}
	if n := b.counter(t, "fn_redis_fallback_rounds_total", "peer"); n < 1 {
		t.Fatalf("%v peer rounds on B, want 1", n)
	}
}
