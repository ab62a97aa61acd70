package redis_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flamenet/relay/internal/servicetest"
	wredis "github.com/flamenet/relay/wake/redis"
)

func TestNewClientForms(t *testing.T) {
	tests := []struct {
		name     string
		url      string
		poolSize int
		check    func(t *testing.T, c goredis.UniversalClient)
	}{
		{
			name: "one node gets short timeouts and the pool size", url: "redis://127.0.0.1:6379/0", poolSize: 32,
			check: func(t *testing.T, c goredis.UniversalClient) {
				o := c.(*goredis.Client).Options()
				if o.PoolSize != 32 || o.DialTimeout != time.Second || o.ReadTimeout != time.Second ||
					o.PoolTimeout != time.Second || o.MaxRetries != 1 || !o.ContextTimeoutEnabled {
					t.Fatalf("options = pool %d dial %v read %v pool timeout %v retries %d ctx %v",
						o.PoolSize, o.DialTimeout, o.ReadTimeout, o.PoolTimeout, o.MaxRetries, o.ContextTimeoutEnabled)
				}
			},
		},
		{
			name: "URL settings win over defaults", url: "redis://127.0.0.1:6379/2?read_timeout=5s&pool_size=7", poolSize: 0,
			check: func(t *testing.T, c goredis.UniversalClient) {
				o := c.(*goredis.Client).Options()
				if o.ReadTimeout != 5*time.Second || o.PoolSize != 7 || o.DB != 2 {
					t.Fatalf("read %v pool %d db %d; want 5s 7 2", o.ReadTimeout, o.PoolSize, o.DB)
				}
			},
		},
		{
			name: "unix socket", url: "unix:///tmp/redis.sock?db=1", poolSize: 4,
			check: func(t *testing.T, c goredis.UniversalClient) {
				o := c.(*goredis.Client).Options()
				if o.Network != "unix" || o.Addr != "/tmp/redis.sock" || o.DB != 1 {
					t.Fatalf("network %q addr %q db %d", o.Network, o.Addr, o.DB)
				}
			},
		},
		{
			name: "cluster", url: "redis://127.0.0.1:7000?cluster=true&addr=127.0.0.1:7001", poolSize: 16,
			check: func(t *testing.T, c goredis.UniversalClient) {
				o := c.(*goredis.ClusterClient).Options()
				if len(o.Addrs) != 2 || o.PoolSize != 16 || !o.ContextTimeoutEnabled {
					t.Fatalf("addrs %v pool %d ctx %v", o.Addrs, o.PoolSize, o.ContextTimeoutEnabled)
				}
			},
		},
		{
			name: "sentinel", url: "redis://127.0.0.1:26379?master_name=mymaster", poolSize: 8,
			check: func(t *testing.T, c goredis.UniversalClient) {
				if _, ok := c.(*goredis.Client); !ok {
					t.Fatalf("client is %T, want a failover *redis.Client", c)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := wredis.NewClient(tt.url, tt.poolSize)
			if err != nil {
				t.Fatalf("NewClient(%q): %v", tt.url, err)
			}
			defer c.Close()
			tt.check(t, c)
		})
	}
}

func TestNewClientRejects(t *testing.T) {
	for _, raw := range []string{
		"http://127.0.0.1:6379",
		"redis://127.0.0.1:6379?cluster=maybe",
		"redis://127.0.0.1:6379?cluster=true&master_name=m",
		"redis://127.0.0.1:6379?no_such_option=1",
		"redis://127.0.0.1:6379/notadb",
	} {
		if c, err := wredis.NewClient(raw, 4); err == nil {
			c.Close()
			t.Errorf("NewClient(%q) = nil error, want one", raw)
		}
	}
}

func TestNewClientConnects(t *testing.T) {
	c, err := wredis.NewClient(servicetest.RedisURL(t), 2)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}
