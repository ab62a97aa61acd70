package redis_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/wake"
	wredis "github.com/flamenet/relay/wake/redis"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var unique atomic.Int64

// uniqueName is a name no other test (here or in another process) uses:
// a key prefix or a Redis client name.
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
// its blocked BRPOPs can be counted) and its own hub.
type process struct {
	name   string
	client goredis.UniversalClient
	hub    *wredis.Hub
}

// newProcess builds a client on rawURL and a hub with cfg. The hub closes
// and then the client closes at the end of the test.
func newProcess(tb testing.TB, rawURL string, poolSize int, cfg wredis.Config) *process {
	tb.Helper()
	name := uniqueName("client")
	client, err := wredis.NewClient(withClientName(tb, rawURL, name), poolSize)
	if err != nil {
		tb.Fatalf("NewClient: %v", err)
	}
	tb.Cleanup(func() { _ = client.Close() })
	if cfg.Logger == nil {
		cfg.Logger = testLogger(tb)
	}
	hub := wredis.New(client, cfg)
	tb.Cleanup(func() { _ = hub.Close() })
	return &process{name: name, client: client, hub: hub}
}

// sharedRedis returns the test Redis URL and a fresh key prefix whose keys
// are deleted at the end of the test. Nothing else on the server is touched.
func sharedRedis(tb testing.TB) (string, string) {
	tb.Helper()
	raw := servicetest.RedisURL(tb)
	prefix := uniqueName("wake") + ":"
	admin := adminClient(tb, raw)
	tb.Cleanup(func() { deletePrefix(tb, admin, prefix) })
	return raw, prefix
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

func deletePrefix(tb testing.TB, c *goredis.Client, prefix string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		tb.Logf("scan %s*: %v", prefix, err)
		return
	}
	if len(keys) > 0 {
		if err := c.Del(ctx, keys...).Err(); err != nil {
			tb.Logf("delete %s*: %v", prefix, err)
		}
	}
}

// waitBlocked polls CLIENT LIST until at least n connections named name are
// blocked in BRPOP, so a test knows a Wait has reached Redis.
func waitBlocked(tb testing.TB, admin *goredis.Client, name string, n int) {
	tb.Helper()
	if got, err := blockedWithin(admin, name, n, 10*time.Second); got < n {
		tb.Fatalf("%d of %d BRPOPs of %s blocked after 10s (last error %v)", got, n, name, err)
	}
}

// blockedWithin polls CLIENT LIST for up to d until n connections named
// name are blocked in BRPOP; it returns the last count seen.
func blockedWithin(admin *goredis.Client, name string, n int, d time.Duration) (int, error) {
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		list, err := admin.ClientList(ctx).Result()
		cancel()
		got := 0
		if err == nil {
			for line := range strings.SplitSeq(list, "\n") {
				if strings.Contains(line, " name="+name+" ") && strings.Contains(line, " cmd=brpop ") {
					got++
				}
			}
		}
		if got >= n || time.Now().After(deadline) {
			return got, err
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of CLIENT LIST
	}
}

func subscribe(tb testing.TB, h wake.Hub, k wake.Key) wake.Waiter {
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

func signal(tb testing.TB, h wake.Hub, keys ...wake.Key) {
	tb.Helper()
	if err := h.Signal(context.Background(), wakes(keys...)); err != nil {
		tb.Fatalf("Signal: %v", err)
	}
}

func dev(i int) wake.Key {
	return wake.Key{Household: "home", Device: fmt.Sprintf("dev-%d", i)}
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

// wakes is a wake for each key, at head 1.
func wakes(keys ...wake.Key) []wake.Wake {
	ws := make([]wake.Wake, len(keys))
	for i, k := range keys {
		ws[i] = wake.Wake{Key: k, Head: 1}
	}
	return ws
}
