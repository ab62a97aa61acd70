package push

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/prometheus/client_golang/prometheus"
)

// job is a UnifiedPush job for a device in a household of its own, so that
// the household caps stay out of the way of tests about the queue's own
// bounds. Tests of the caps name households themselves.
func job(dev, address string) Job {
	return Job{Household: "hh-" + dev, Device: dev, Target: device.PushTarget{Kind: device.PushUnifiedPush, Address: address}}
}

func TestOnePushPerJob(t *testing.T) {
	fake := newUPFake(t, nil)
	q := newQueue(t, Config{AllowPrivate: true}, nil)
	const n = 20
	for i := range n {
		if !q.Enqueue(job(fmt.Sprint("d", i), fake.url(fmt.Sprint("/d", i)))) {
			t.Fatalf("Enqueue %d refused", i)
		}
	}
	waitFor(t, "all pushes sent", func() bool { return q.Stats().Sent == n })
	s := closeQueue(t, q)
	if s.Attempted != n || s.Failed != 0 || s.Dropped != 0 {
		t.Errorf("stats %+v, want %d attempted and sent, nothing else", s, n)
	}
	for i := range n {
		if got := fake.hitsFor(fmt.Sprint("/d", i)); got != 1 {
			t.Errorf("device d%d got %d pushes, want 1", i, got)
		}
	}
	fake.checkBodies(t)
}

// TestBurst: 10,000 Enqueue calls for 5,000 devices while every worker is
// stuck on a slow provider. With W workers busy on devices d0..d(W-1) and a
// queue of Q:
//   - round one (d0..d4999) queues d0..d(Q-1) (the busy devices are not
//     queued, so they queue again) and drops the other 5000-Q;
//   - round two coalesces d0..d(Q-1) into their queued pushes and drops
//     the other 5000-Q again.
//
// So dropped = 2*(5000-Q), coalesced = Q, and once released sent = W+Q.
// Removing the pending-map check in Enqueue (done once on purpose) turns
// this red: coalesced is 0, drops are off, and devices get two pushes.
func TestBurst(t *testing.T) {
	const (
		workers = 8
		size    = 1024
		devices = 5000
	)
	fake := newUPFake(t, nil)
	fake.gate = make(chan struct{})
	q := newQueue(t, Config{Workers: workers, QueueSize: size, AllowPrivate: true, Timeout: time.Minute}, nil)
	dev := func(i int) Job { return job(fmt.Sprint("d", i), fake.url(fmt.Sprint("/d", i))) }

	for i := range workers {
		q.Enqueue(dev(i))
	}
	waitFor(t, "every worker stuck in the fake", func() bool { return fake.inFlight.Load() == workers })

	start := time.Now()
	accepted := 0
	for range 2 {
		for i := range devices {
			if q.Enqueue(dev(i)) {
				accepted++
			}
		}
	}
	elapsed := time.Since(start)
	// A generous sanity bound; BenchmarkEnqueue measures the real cost.
	if elapsed > 5*time.Second {
		t.Errorf("10,000 Enqueue calls took %v: Enqueue must not block", elapsed)
	}

	s := q.Stats()
	if accepted != size || s.Queued != size || s.QueueHighWater != size || s.InFlight != workers {
		t.Errorf("accepted %d, queued %d, high water %d, in flight %d; want %d, %d, %d, %d",
			accepted, s.Queued, s.QueueHighWater, s.InFlight, size, size, size, workers)
	}
	if want := uint64(2 * (devices - size)); s.DroppedQueueFull != want {
		t.Errorf("dropped (queue full) %d, want %d", s.DroppedQueueFull, want)
	}
	if s.Coalesced != size {
		t.Errorf("coalesced %d, want %d", s.Coalesced, size)
	}

	close(fake.gate)
	waitFor(t, "queue drained", func() bool {
		s := q.Stats()
		return s.Queued == 0 && s.InFlight == 0
	})
	s = closeQueue(t, q)
	if s.Sent != workers+size || s.Failed != 0 || s.Dropped != 2*(devices-size) {
		t.Errorf("sent %d failed %d dropped %d; want %d, 0, %d", s.Sent, s.Failed, s.Dropped, workers+size, 2*(devices-size))
	}
	if s.Attempted != workers+2*devices-size {
		t.Errorf("attempted %d, want %d", s.Attempted, workers+2*devices-size)
	}
	if s.QueueHighWater > size {
		t.Errorf("queue reached %d, above its bound %d", s.QueueHighWater, size)
	}
	for i := range devices {
		want := 0
		switch {
		case i < workers:
			want = 2 // once before the burst, once queued in it
		case i < size:
			want = 1
		}
		if got := fake.hitsFor(fmt.Sprint("/d", i)); got != want {
			t.Errorf("device d%d got %d pushes, want %d", i, got, want)
		}
	}
	fake.checkBodies(t)
}

// A second send while a push is queued adds nothing, but the queued push
// goes to the newest target.
func TestCoalesceKeepsNewestTarget(t *testing.T) {
	fake := newUPFake(t, nil)
	fake.gate = make(chan struct{})
	q := newQueue(t, Config{Workers: 1, QueueSize: 4, AllowPrivate: true}, nil)
	q.Enqueue(job("busy", fake.url("/busy")))
	waitFor(t, "worker busy", func() bool { return fake.inFlight.Load() == 1 })

	if !q.Enqueue(job("phone", fake.url("/old"))) {
		t.Fatal("first Enqueue for phone refused")
	}
	if q.Enqueue(job("phone", fake.url("/new"))) {
		t.Fatal("second Enqueue for a queued device accepted")
	}
	close(fake.gate)
	waitFor(t, "pushes sent", func() bool { return q.Stats().Sent == 2 })
	s := closeQueue(t, q)
	if fake.hitsFor("/old") != 0 || fake.hitsFor("/new") != 1 || s.Coalesced != 1 {
		t.Errorf("old %d, new %d, coalesced %d; want 0, 1, 1", fake.hitsFor("/old"), fake.hitsFor("/new"), s.Coalesced)
	}
}

// A push already taken by a worker no longer absorbs new sends: the device
// is pushed again, so a wake cannot be lost to one that had already left.
// Moving the worker's delete from pending to after the push (done once on
// purpose) turns this red.
func TestInFlightDoesNotAbsorb(t *testing.T) {
	fake := newUPFake(t, nil)
	fake.gate = make(chan struct{})
	q := newQueue(t, Config{Workers: 1, QueueSize: 4, AllowPrivate: true}, nil)
	q.Enqueue(job("phone", fake.url("/phone")))
	waitFor(t, "push in flight", func() bool { return fake.inFlight.Load() == 1 })
	if !q.Enqueue(job("phone", fake.url("/phone"))) {
		t.Fatal("Enqueue for a device whose push is in flight was refused")
	}
	close(fake.gate)
	waitFor(t, "pushes sent", func() bool { return q.Stats().Sent == 2 })
	closeQueue(t, q)
	if got := fake.hitsFor("/phone"); got != 2 {
		t.Errorf("phone got %d pushes, want 2", got)
	}
}

// Removing Enqueue's closed check (done once on purpose) turns this red:
// the late push is accepted and never ends.
func TestShutdownDropsQueuedAndInFlight(t *testing.T) {
	fake := newUPFake(t, nil)
	fake.gate = make(chan struct{}) // never opened: the provider hangs
	q := newQueue(t, Config{Workers: 2, QueueSize: 10, AllowPrivate: true, Timeout: time.Minute}, nil)
	for i := range 7 {
		q.Enqueue(job(fmt.Sprint("d", i), fake.url(fmt.Sprint("/d", i))))
	}
	waitFor(t, "two pushes in flight", func() bool { return fake.inFlight.Load() == 2 })

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	q.Close(ctx)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v with a 200ms bound", d)
	}
	if q.Enqueue(job("late", fake.url("/late"))) {
		t.Error("Enqueue after Close accepted")
	}
	s := closeQueue(t, q) // a second Close is harmless
	if s.DroppedShutdown != 8 || s.Sent != 0 || s.Failed != 0 || s.Attempted != 8 {
		t.Errorf("stats %+v; want 8 attempted, all dropped at shutdown", s)
	}
	if fake.total() != 2 {
		t.Errorf("fake saw %d pushes, want the 2 in flight", fake.total())
	}
}

func TestShutdownLetsInFlightFinish(t *testing.T) {
	fake := newUPFake(t, nil)
	fake.gate = make(chan struct{})
	q := newQueue(t, Config{Workers: 2, QueueSize: 10, AllowPrivate: true, Timeout: time.Minute}, nil)
	for i := range 3 {
		q.Enqueue(job(fmt.Sprint("d", i), fake.url(fmt.Sprint("/d", i))))
	}
	waitFor(t, "two pushes in flight", func() bool { return fake.inFlight.Load() == 2 })

	closed := make(chan struct{})
	go func() {
		defer close(closed)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		q.Close(ctx)
	}()
	waitFor(t, "queue closed", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.closed
	})
	close(fake.gate)
	<-closed
	s := q.Stats()
	if s.Sent != 2 || s.DroppedShutdown != 1 || s.Attempted != 3 {
		t.Errorf("stats %+v; want the 2 in flight sent and the queued one dropped", s)
	}
}

func TestUnconfiguredKindDropped(t *testing.T) {
	q := newQueue(t, Config{}, nil)
	if q.Enabled(device.PushAPNs) || !q.Enabled(device.PushUnifiedPush) {
		t.Error("Enabled: want unifiedpush only")
	}
	for _, tg := range []device.PushTarget{{Kind: device.PushAPNs, Address: "ab"}, {Kind: "carrier-pigeon", Address: "x"}, {Kind: device.PushUnifiedPush}} {
		if q.Enqueue(Job{Household: "h", Device: "d", Target: tg}) {
			t.Errorf("Enqueue(%+v) accepted", tg)
		}
	}
	if s := closeQueue(t, q); s.DroppedUnconfigured != 3 {
		t.Errorf("dropped (unconfigured) %d, want 3", s.DroppedUnconfigured)
	}
}

// Drops are logged as a running total, not a line each.
func TestDropLogIsRateLimited(t *testing.T) {
	var logs servicetest.Buffer
	fake := newUPFake(t, nil)
	fake.gate = make(chan struct{})
	q := newQueue(t, Config{Workers: 1, QueueSize: 1, AllowPrivate: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, nil)
	q.Enqueue(job("busy", fake.url("/busy")))
	waitFor(t, "worker busy", func() bool { return fake.inFlight.Load() == 1 })
	q.Enqueue(job("queued", fake.url("/queued")))
	for i := range 1000 {
		q.Enqueue(job(fmt.Sprint("d", i), fake.url("/x")))
	}
	if got := strings.Count(logs.String(), "push dropped"); got != 1 {
		t.Errorf("%d drop log lines for 1000 drops, want 1:\n%s", got, logs.String())
	}
	if s := q.Stats(); s.DroppedQueueFull != 1000 {
		t.Errorf("dropped %d, want 1000", s.DroppedQueueFull)
	}
	close(fake.gate)
}

// gather reads reg's series as name{label=value} -> value (a histogram's
// sample count), and fails on a label other than reason or provider, or one
// that names a household or device.
func gather(tb testing.TB, reg *prometheus.Registry) map[string]float64 {
	tb.Helper()
	got := map[string]float64{}
	families, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), "secret") || (l.GetName() != "reason" && l.GetName() != "provider") {
					tb.Errorf("%s has label %s=%q", name, l.GetName(), l.GetValue())
				}
				name += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.Counter != nil:
				got[name] = m.Counter.GetValue()
			case m.Gauge != nil:
				got[name] = m.Gauge.GetValue()
			case m.Histogram != nil:
				got[name] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return got
}

func checkMetrics(tb testing.TB, got, want map[string]float64) {
	tb.Helper()
	for k, v := range want {
		if got[k] != v {
			tb.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	fake := newUPFake(t, func(path string, _ int) (int, string) {
		if path == "/gone" {
			return 410, ""
		}
		return 201, ""
	})
	fake.gate = make(chan struct{})
	q := newQueue(t, Config{Workers: 1, QueueSize: 8, HouseholdQueue: 2, HouseholdInFlight: 1,
		AllowPrivate: true, Registerer: reg}, nil)
	home := func(dev, path string) Job { return householdJob("secret-household", dev, fake.url(path)) }
	q.Enqueue(home("secret-device-name", "/ok"))
	waitFor(t, "first push in flight", func() bool { return fake.inFlight.Load() == 1 })
	q.Enqueue(home("gone", "/gone"))
	q.Enqueue(home("d2", "/ok2"))
	q.Enqueue(home("d3", "/ok3")) // past the household's share of 2
	q.Enqueue(Job{Household: "h", Device: "d", Target: device.PushTarget{Kind: device.PushFCM, Address: "t"}})

	// The household is at its cap of 1 with 2 pushes held back.
	checkMetrics(t, gather(t, reg), map[string]float64{
		"fn_push_queued":                   2,
		"fn_push_households_at_cap":        1,
		"fn_push_household_deferred_total": 2,
	})
	close(fake.gate)
	waitFor(t, "pushes done", func() bool { s := q.Stats(); return s.Sent+s.Failed == 3 })
	closeQueue(t, q)

	checkMetrics(t, gather(t, reg), map[string]float64{
		"fn_push_attempted_total":                        5,
		"fn_push_sent_total":                             2,
		"fn_push_gone_total":                             1,
		"fn_push_failed_total{provider=unifiedpush}":     1,
		"fn_push_dropped_total{reason=unconfigured}":     1,
		"fn_push_dropped_total{reason=household_full}":   1,
		"fn_push_dropped_total{reason=queue_full}":       0,
		"fn_push_queued":                                 0,
		"fn_push_households_at_cap":                      0,
		"fn_push_household_deferred_total":               2,
		"fn_push_duration_seconds{provider=unifiedpush}": 3,
		"fn_push_retries_total{provider=unifiedpush}":    0,
		"fn_push_dropped_total{reason=shutdown}":         0,
		"fn_push_coalesced_total":                        0,
	})
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"negative workers", Config{Workers: -1}},
		{"negative household in flight", Config{HouseholdInFlight: -1}},
		{"negative household queue", Config{HouseholdQueue: -1}},
		{"negative attempt timeout", Config{AttemptTimeout: -time.Second}},
		{"negative header timeout", Config{ResponseHeaderTimeout: -time.Second}},
		{"apns without key file", Config{APNs: APNsConfig{KeyFile: "/nonexistent/AuthKey.p8", KeyID: "k", TeamID: "t", Topic: "a"}}},
		{"apns without team", Config{APNs: APNsConfig{KeyFile: "/nonexistent/AuthKey.p8"}}},
		{"fcm without file", Config{FCM: FCMConfig{CredentialsFile: "/nonexistent/sa.json"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if q, err := New(tc.cfg, nil); err == nil {
				q.Close(context.Background())
				t.Error("New accepted it")
			}
		})
	}
}

// BenchmarkEnqueue measures Enqueue against a full queue whose workers are
// stuck: the cost a send pays when pushes back up (drops and coalescing).
func BenchmarkEnqueue(b *testing.B) {
	fake := newUPFake(b, nil)
	fake.gate = make(chan struct{})
	q := newQueue(b, Config{Workers: 8, QueueSize: 1024, AllowPrivate: true, Timeout: time.Minute}, nil)
	jobs := make([]Job, 5000)
	for i := range jobs {
		jobs[i] = job(fmt.Sprint("d", i), fake.url(fmt.Sprint("/d", i)))
	}
	i := 0
	for b.Loop() {
		q.Enqueue(jobs[i%len(jobs)])
		i++
	}
	b.StopTimer()
	close(fake.gate)
}

// BenchmarkEnqueueHouseholds is BenchmarkEnqueue with the devices in 500
// households of 10, so Enqueue also meets the household caps and drops.
func BenchmarkEnqueueHouseholds(b *testing.B) {
	fake := newUPFake(b, nil)
	fake.gate = make(chan struct{})
	q := newQueue(b, Config{Workers: 8, QueueSize: 1024, AllowPrivate: true, Timeout: time.Minute}, nil)
	jobs := make([]Job, 5000)
	for i := range jobs {
		jobs[i] = householdJob(fmt.Sprint("h", i/10), fmt.Sprint("d", i), fake.url(fmt.Sprint("/d", i)))
	}
	i := 0
	for b.Loop() {
		q.Enqueue(jobs[i%len(jobs)])
		i++
	}
	b.StopTimer()
	close(fake.gate)
}
