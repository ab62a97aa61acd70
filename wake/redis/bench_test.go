package redis_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flamenet/relay/device"
)

// The benchmarks here give the figures quoted in docs/ARCHITECTURE.md:
// what a send's Signal costs, how long a wake takes from one relay to a
// poll held on another, and what the rejected designs would add per poll
// or per send. They run against FN_TEST_REDIS_URL.

// BenchmarkSignal: one send to one device, published (the time a send
// waits on Redis after its commit).
func BenchmarkSignal(b *testing.B) {
	raw, prefix := sharedRedis(b)
	a := newProcess(b, raw, 4, steady(prefix))
	k := dev(1)
	b.ResetTimer()
	for i := range b.N {
		if err := a.hub.Signal(context.Background(), wakes(int64(i), k)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSignal64: one send to 64 devices (FN_MAX_RECIPIENTS), one
// pipeline of one message per shard touched.
func BenchmarkSignal64(b *testing.B) {
	raw, prefix := sharedRedis(b)
	a := newProcess(b, raw, 4, steady(prefix))
	var keys []device.Key
	for i := range 64 {
		keys = append(keys, dev(i))
	}
	b.ResetTimer()
	for i := range b.N {
		if err := a.hub.Signal(context.Background(), wakes(int64(i), keys...)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWakeAcross: Signal on one relay until the poll held on another
// returns from Wait.
func BenchmarkWakeAcross(b *testing.B) {
	raw, prefix := sharedRedis(b)
	a := newProcess(b, raw, 4, steady(prefix))
	p := newProcess(b, raw, 4, steady(prefix))
	k := dev(1)
	w := subscribe(b, p.hub, k)
	b.ResetTimer()
	for i := range b.N {
		got := waitAsync(context.Background(), w)
		if err := a.hub.Signal(context.Background(), wakes(int64(i), k)); err != nil {
			b.Fatal(err)
		}
		if err := <-got; err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAltSubscribePerPoll: the per-device-channel design's cost per
// poll: SUBSCRIBE to the device's channel on a shared connection, wait for
// the confirmation (it must come before the poll's first read), and
// UNSUBSCRIBE when the poll ends.
func BenchmarkAltSubscribePerPoll(b *testing.B) {
	raw, prefix := sharedRedis(b)
	c := newClient(b, raw, 4).client
	ctx := context.Background()
	ps := c.Subscribe(ctx)
	defer ps.Close()
	b.ResetTimer()
	for i := range b.N {
		ch := fmt.Sprintf("%sdev-%d", prefix, i)
		if err := ps.Subscribe(ctx, ch); err != nil {
			b.Fatal(err)
		}
		confirm(b, ps, "subscribe")
		if err := ps.Unsubscribe(ctx, ch); err != nil {
			b.Fatal(err)
		}
		confirm(b, ps, "unsubscribe")
	}
}

func confirm(b *testing.B, ps *goredis.PubSub, kind string) {
	for {
		m, err := ps.ReceiveTimeout(context.Background(), 5*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if s, ok := m.(*goredis.Subscription); ok && s.Kind == kind {
			return
		}
	}
}

// BenchmarkAltRoutingKey: the routing-key design's cost per send: read
// which relay holds the device's poll (GET), then publish to that relay's
// channel: two round trips in sequence, the second depending on the first.
// (Each poll would also write its key with a TTL.)
func BenchmarkAltRoutingKey(b *testing.B) {
	raw, prefix := sharedRedis(b)
	c := newClient(b, raw, 4).client
	ctx := context.Background()
	route := prefix + "route:{home:dev-1}"
	if err := c.Set(ctx, route, "relay-7", time.Minute).Err(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Del(context.Background(), route) })
	b.ResetTimer()
	for range b.N {
		relay, err := c.Get(ctx, route).Result()
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Publish(ctx, prefix+relay, "wake").Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAltListMarker: the pending-marker design's cost per send: a
// per-device list kept as a marker (LPUSH, LTRIM, EXPIRE) beside the
// PUBLISH, in one pipeline; each poll would also pop the marker before it
// waits.
func BenchmarkAltListMarker(b *testing.B) {
	raw, prefix := sharedRedis(b)
	c := newClient(b, raw, 4).client
	ctx := context.Background()
	key := prefix + "{home:dev-1}"
	b.Cleanup(func() { c.Del(context.Background(), key) })
	b.ResetTimer()
	for range b.N {
		_, err := c.Pipelined(ctx, func(p goredis.Pipeliner) error {
			p.LPush(ctx, key, "1")
			p.LTrim(ctx, key, 0, 0)
			p.Expire(ctx, key, 70*time.Second)
			p.Publish(ctx, prefix+"shard", "wake")
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
