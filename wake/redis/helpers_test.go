package redis_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/wake"
	wredis "github.com/flamenet/relay/wake/redis"
)

func TestMain(m *testing.M) {
	// go-redis retries a dial that failed (a Cluster node killed) on a
	// goroutine that sleeps a second between tries, and ends at the first
	// try after its pool's Close: up to a second after the last test, more
	// than goleak waits.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

var unique atomic.Int64

// uniqueName is a name no other test (here or in another process) uses:
// a channel prefix or a Redis client name.
func uniqueName(kind string) string {
	return fmt.Sprintf("fn-test-%s-%d-%d", kind, time.Now().UnixNano(), unique.Add(1))
}

// withClientName adds client_name to a Redis URL, so that a test can find
// its own connections in CLIENT LIST on a shared server.
func withClientName(tb testing.TB, raw, name string) string {
	tb.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		tb.Fatalf("parse %q: %v", raw, err)
	}
	q := u.Query()
	q.Set("client_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// process is one relay process's view of Redis: its own client (named, so
// its connections can be counted), its hub, the hub's observer and its
// metrics.
type process struct {
	name   string
	client goredis.UniversalClient
	hub    *wredis.Hub
	obs    *recorder
	reg    *prometheus.Registry

	obsDelay time.Duration // the recorder's delay
}

// newProcess builds a client on rawURL and a hub with cfg (its Observer,
// Logger and Registerer are the test's). The hub closes and then the
// client closes at the end of the test.
func newProcess(tb testing.TB, rawURL string, poolSize int, cfg wredis.Config) *process {
	tb.Helper()
	p := newClient(tb, rawURL, poolSize)
	p.start(tb, cfg)
	return p
}

func newClient(tb testing.TB, rawURL string, poolSize int) *process {
	tb.Helper()
	name := uniqueName("client")
	client, err := wredis.NewClient(withClientName(tb, rawURL, name), poolSize)
	if err != nil {
		tb.Fatalf("NewClient: %v", err)
	}
	tb.Cleanup(func() { _ = client.Close() })
	return &process{name: name, client: client}
}

// start makes p's hub; it fails the test if New fails.
func (p *process) start(tb testing.TB, cfg wredis.Config) {
	tb.Helper()
	if err := p.tryStart(tb, cfg); err != nil {
		tb.Fatalf("New: %v", err)
	}
}

func (p *process) tryStart(tb testing.TB, cfg wredis.Config) error {
	tb.Helper()
	p.obs = newRecorder()
	p.obs.delay = p.obsDelay
	p.reg = prometheus.NewRegistry()
	cfg.Observer, cfg.Registerer = p.obs, p.reg
	if cfg.Logger == nil {
		cfg.Logger = testLogger(tb)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hub, err := wredis.New(ctx, p.client, cfg)
	if err != nil {
		return err
	}
	tb.Cleanup(func() { _ = hub.Close() })
	p.hub = hub
	return nil
}

// counter reads one of p's hub's counters (a label value for vectors).
func (p *process) counter(tb testing.TB, name string, label ...string) float64 {
	tb.Helper()
	mfs, err := p.reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(label) == 0 || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label[0]) {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	tb.Fatalf("no series %s%v", name, label)
	return 0
}

// sharedRedis returns the test Redis URL and a channel prefix of the
// test's own, so that hubs of other tests on the server are not heard.
func sharedRedis(tb testing.TB) (string, string) {
	tb.Helper()
	return servicetest.RedisURL(tb), uniqueName("wake") + ":"
}

func adminClient(tb testing.TB, raw string) *goredis.Client {
	tb.Helper()
	o, err := goredis.ParseURL(raw)
	if err != nil {
		tb.Fatalf("ParseURL: %v", err)
	}
	o.MaxRetries = -1
	c := goredis.NewClient(o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// connections counts the connections named name in CLIENT LIST, and those
// of them whose last command was cmd (any when cmd is "").
func connections(tb testing.TB, admin *goredis.Client, name, cmd string) int {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := admin.ClientList(ctx).Result()
	if err != nil {
		tb.Fatalf("CLIENT LIST: %v", err)
	}
	n := 0
	for line := range strings.SplitSeq(list, "\n") {
		if strings.Contains(line, " name="+name+" ") && (cmd == "" || strings.Contains(line, " cmd="+cmd+" ")) {
			n++
		}
	}
	return n
}

// connectedClients is INFO clients' connected_clients.
func connectedClients(tb testing.TB, admin *goredis.Client) int {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := admin.Info(ctx, "clients").Result()
	if err != nil {
		tb.Fatalf("INFO clients: %v", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
			var n int
			fmt.Sscan(v, &n)
			return n
		}
	}
	tb.Fatalf("no connected_clients in %q", info)
	return 0
}

func subscribe(tb testing.TB, h wake.Hub, k device.Key) wake.Waiter {
	tb.Helper()
	w, err := h.Subscribe(context.Background(), k)
	if err != nil {
		tb.Fatalf("Subscribe(%v): %v", k, err)
	}
	tb.Cleanup(w.Close)
	return w
}

func waitFor(w wake.Waiter, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return w.Wait(ctx)
}

// waitAsync runs Wait in a goroutine; the result arrives on the channel.
func waitAsync(ctx context.Context, w wake.Waiter) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- w.Wait(ctx) }()
	return ch
}

func receive(tb testing.TB, ch <-chan error, within time.Duration, what string) error {
	tb.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(within):
		tb.Fatalf("%s: Wait did not return within %v", what, within)
		return nil
	}
}

func dev(i int) device.Key {
	return device.Key{Household: "home", Device: fmt.Sprintf("dev-%d", i)}
}

// eventually polls cond every few milliseconds for up to d.
func eventually(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond) // bounded poll
	}
}

// testLogger writes the hub's log lines to the test log.
func testLogger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// recorder is an Observer that remembers what it heard.
type recorder struct {
	// delay is spent in Advanced and Removed before recording, to widen
	// the window in which a waiter woken too early would find nothing.
	delay     time.Duration
	mu        sync.Mutex
	heads     map[device.Key]int64
	removed   map[device.Key]time.Time
	advanced  map[device.Key]int // calls per key
	envelopes map[device.Key]string
	forgot    map[device.Key]int
	lost      int
}

func newRecorder() *recorder {
	return &recorder{heads: map[device.Key]int64{}, removed: map[device.Key]time.Time{}, advanced: map[device.Key]int{},
		envelopes: map[device.Key]string{}, forgot: map[device.Key]int{}}
}

func (r *recorder) Advanced(w wake.Wake) {
	time.Sleep(r.delay)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.heads[w.Key] = max(r.heads[w.Key], w.Head)
	r.advanced[w.Key]++
	if w.Envelope != nil {
		r.envelopes[w.Key] = string(w.Envelope)
	}
}

func (r *recorder) Removed(k device.Key, at time.Time) {
	time.Sleep(r.delay)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removed[k] = at
}

func (r *recorder) Lost() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lost++
}

func (r *recorder) Forget(k device.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgot[k]++
}

func (r *recorder) forgotten(k device.Key) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.forgot[k]
}

func (r *recorder) head(k device.Key) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.heads[k]
}

func (r *recorder) calls(k device.Key) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.advanced[k]
}

func (r *recorder) removedAt(k device.Key) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.removed[k]
}

func (r *recorder) rounds() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}

// wakes is a wake for each key at head.
func wakes(head int64, keys ...device.Key) []wake.Wake {
	ws := make([]wake.Wake, len(keys))
	for i, k := range keys {
		ws[i] = wake.Wake{Key: k, Head: head}
	}
	return ws
}

// publishCounter is a go-redis hook that counts what a client publishes:
// pipelines, and publish commands by message kind ('V', 'R', 'H', 'L').
type publishCounter struct {
	mu        sync.Mutex
	pipelines map[byte]int // pipelines that carried a message of the kind
	publishes map[byte]int
}

func countPublishes(c goredis.UniversalClient) *publishCounter {
	pc := &publishCounter{pipelines: map[byte]int{}, publishes: map[byte]int{}}
	c.AddHook(pc)
	return pc
}

func (pc *publishCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (pc *publishCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		pc.record([]goredis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (pc *publishCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		pc.record(cmds)
		return next(ctx, cmds)
	}
}

func (pc *publishCounter) record(cmds []goredis.Cmder) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	kinds := map[byte]bool{}
	for _, c := range cmds {
		if n := c.Name(); n != "publish" && n != "spublish" {
			continue
		}
		if b, ok := c.Args()[2].([]byte); ok && len(b) > 0 {
			pc.publishes[b[0]]++
			kinds[b[0]] = true
		}
	}
	for k := range kinds {
		pc.pipelines[k]++
	}
}

func (pc *publishCounter) get(kind byte) (pipelines, publishes int) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.pipelines[kind], pc.publishes[kind]
}
