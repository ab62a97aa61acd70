package redis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/servicetest"
	wredis "github.com/flamenet/relay/wake/redis"
)

// nodeAdmin is a plain client on one cluster node, for CLIENT LIST, INFO
// and CLUSTER commands there.
func nodeAdmin(tb testing.TB, s *servicetest.RedisServer) *goredis.Client {
	tb.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr(), MaxRetries: -1})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// masters returns the addresses of the nodes that are masters now.
func masters(tb testing.TB, c *servicetest.RedisCluster) map[string]*servicetest.RedisServer {
	tb.Helper()
	out := map[string]*servicetest.RedisServer{}
	for _, s := range c.Nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		role, err := nodeAdmin(tb, s).Do(ctx, "role").Slice()
		cancel()
		if err == nil && len(role) > 0 && role[0] == "master" {
			out[s.Addr()] = s
		}
	}
	return out
}

// wakeEveryMaster sends one wake from a to a device held on b whose
// channel is on each master, and checks that each arrives by the message
// (b's observer has the head), within d.
func wakeEveryMaster(t *testing.T, a, b *process, head int64, d time.Duration) {
	t.Helper()
	cc := a.client.(*goredis.ClusterClient)
	byMaster := map[string]device.Key{}
	for i := 0; i < 1000 && len(byMaster) < 3; i++ {
		k := dev(i)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		node, err := cc.MasterForKey(ctx, a.hub.DeviceChannel(k))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := byMaster[node.Options().Addr]; !ok {
			byMaster[node.Options().Addr] = k
		}
	}
	if len(byMaster) < 3 {
		t.Fatalf("devices on %d masters, want 3", len(byMaster))
	}
	for addr, k := range byMaster {
		w := subscribe(t, b.hub, k)
		if !b.hub.Hears(k) {
			// Subscribe gave up waiting (a loaded machine, a topology
			// that just changed): the confirmation wakes this poll, which
			// is not the path under test. A poll after it hears messages.
			eventually(t, 5*time.Second, "b hears the device on "+addr, func() bool { return b.hub.Hears(k) })
			w.Close()
			w = subscribe(t, b.hub, k)
		}
		got := waitAsync(context.Background(), w)
		if err := a.hub.Signal(context.Background(), wakes(head, k)); err != nil {
			t.Fatalf("Signal to a device on %s: %v", addr, err)
		}
		if err := receive(t, got, d, "poll on "+addr); err != nil {
			t.Fatalf("Wait on %s = %v", addr, err)
		}
		if h := b.obs.head(k); h != head {
			t.Fatalf("master %s: observer head %d, want %d (woken by a round, not the message)", addr, h, head)
		}
		w.Close()
	}
}

// On a Redis Cluster the hub uses sharded pub/sub: one subscriber
// connection per master, SSUBSCRIBE there, SPUBLISH to the channel's
// slot owner only (never PUBLISH, which a cluster broadcasts to every
// node), and wakes on every shard cross between hubs.
func TestCluster(t *testing.T) {
	c := servicetest.StartRedisCluster(t, 3, 0)
	a := newProcess(t, c.URL(), 2, steady("fn:wake:"))
	b := newProcess(t, c.URL(), 2, steady("fn:wake:"))
	wakeEveryMaster(t, a, b, 1, 2*time.Second)

	for _, s := range c.Nodes {
		admin := nodeAdmin(t, s)
		if n := connections(t, admin, b.name, "ssubscribe"); n != 1 {
			t.Fatalf("node %s: %d subscriber connections of the hub, want 1", s.Addr(), n)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		stats, err := admin.Info(ctx, "commandstats").Result()
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(stats, "cmdstat_spublish:") || strings.Contains(stats, "cmdstat_publish:") {
			t.Fatalf("node %s: want SPUBLISH and no PUBLISH in commandstats:\n%s", s.Addr(), stats)
		}
	}
	if n := b.obs.rounds(); n != 0 {
		t.Fatalf("%d fallback rounds on a healthy cluster", n)
	}
}

// A slot moved between masters: Redis drops the subscribers of a held
// device's channel (SUNSUBSCRIBE), the hub subscribes again on the new
// owner, runs one round for what it may have missed, and wakes travel by
// message again.
func TestClusterSlotMigration(t *testing.T) {
	c := servicetest.StartRedisCluster(t, 3, 0)
	a := newProcess(t, c.URL(), 2, steady("fn:wake:"))
	b := newProcess(t, c.URL(), 2, steady("fn:wake:"))
	k := dev(1)
	ch := a.hub.DeviceChannel(k)
	defer subscribe(t, b.hub, k).Close()

	ids := map[string]string{} // addr -> node id
	for _, s := range c.Nodes {
		ids[s.Addr()] = strings.TrimSpace(c.CLI(t, s.Addr(), "cluster", "myid"))
	}
	slot := strings.TrimSpace(c.CLI(t, c.Nodes[0].Addr(), "cluster", "keyslot", ch))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	owner, err := a.client.(*goredis.ClusterClient).MasterForKey(ctx, ch)
	if err != nil {
		t.Fatal(err)
	}
	src := owner.Options().Addr
	var dst string
	for addr := range masters(t, c) {
		if addr != src {
			dst = addr
			break
		}
	}
	t.Logf("moving slot %s (%s) from %s to %s", slot, ch, src, dst)
	c.CLI(t, dst, "cluster", "setslot", slot, "importing", ids[src])
	c.CLI(t, src, "cluster", "setslot", slot, "migrating", ids[dst])
	for addr := range masters(t, c) {
		c.CLI(t, addr, "cluster", "setslot", slot, "node", ids[dst])
	}
	c.WaitOK(t, 10*time.Second)

	eventually(t, 10*time.Second, "B subscribes again", func() bool {
		return b.counter(t, "fn_redis_subscriber_reconnects_total") >= 1 && b.hub.Health() == nil
	})
	eventually(t, 10*time.Second, "a round for the moved slot", func() bool {
		return b.counter(t, "fn_redis_fallback_rounds_total", "resubscribed")+b.counter(t, "fn_redis_fallback_rounds_total", "recovered") >= 1
	})
	// The moved channel's subscriber is now on its new owner.
	eventually(t, 10*time.Second, "B subscribed on the new owner", func() bool {
		for _, s := range c.Nodes {
			if s.Addr() == dst {
				out := c.CLI(t, dst, "pubsub", "shardnumsub", ch)
				return strings.Contains(out, "1") // B's
			}
		}
		return false
	})
	// Messages flow on every shard again (A's own publishes may need a
	// MOVED and a slot-map reload first).
	eventually(t, 10*time.Second, "the moved shard carries wakes", func() bool {
		return messagePathWorks(a, b, k, 2, 200*time.Millisecond)
	})
	wakeEveryMaster(t, a, b, 3, 2*time.Second)
}

// A master killed in a cluster with replicas: its replica takes over (the
// cluster's own failover, cluster-node-timeout 1 s), the hubs subscribe
// on the new master, held polls re-read meanwhile, and wakes travel by
// message again on every shard.
func TestClusterFailover(t *testing.T) {
	c := servicetest.StartRedisCluster(t, 3, 1)
	a := newProcess(t, c.URL(), 2, wredis.Config{})
	b := newProcess(t, c.URL(), 2, wredis.Config{})
	k := dev(1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	owner, err := a.client.(*goredis.ClusterClient).MasterForKey(ctx, a.hub.DeviceChannel(k))
	if err != nil {
		t.Fatal(err)
	}
	victim := masters(t, c)[owner.Options().Addr]
	w := subscribe(t, b.hub, k)
	got := waitAsync(context.Background(), w)

	victim.Stop()
	killed := time.Now()
	_ = a.hub.Signal(context.Background(), wakes(1, k)) // may fail: that slot has no master
	if err := receive(t, got, wredis.DefaultFallbackInterval+3*time.Second, "poll on the failed master's shard"); err != nil {
		t.Fatalf("Wait = %v", err)
	}
	c.WaitFailover(t, victim.Addr(), 30*time.Second)
	t.Logf("a replica took over %v after the kill", time.Since(killed))
	eventually(t, 20*time.Second, "both hubs healthy", func() bool { return a.hub.Health() == nil && b.hub.Health() == nil })
	t.Logf("hubs healthy %v after the kill", time.Since(killed))
	wakeEveryMaster(t, a, b, 2, 2*time.Second)
	if n := b.counter(t, "fn_redis_fallback_rounds_total", "unhealthy"); n < 1 {
		t.Fatal("no fallback round during the failover")
	}
}
