package cli

import (
	"context"
	"crypto/rand"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/internal/servicetest"
	wakeredis "github.com/flamenet/relay/wake/redis"
)

// TestRedisChannelPrefix: FN_REDIS_CHANNEL_PREFIX is read, checked and
// reaches the wake hub, whose every channel starts with it: fleets that
// share a Redis database are kept apart by it.
func TestRedisChannelPrefix(t *testing.T) {
	if c := config.Default(); c.RedisChannelPrefix != wakeredis.DefaultPrefix {
		t.Errorf("default FN_REDIS_CHANNEL_PREFIX %q, want the hub's %q", c.RedisChannelPrefix, wakeredis.DefaultPrefix)
	}
	for _, bad := range []string{"a{b}:", "with space:"} {
		if _, err := config.FromEnv(env(map[string]string{"FN_REDIS_CHANNEL_PREFIX": bad})); err == nil || !strings.Contains(err.Error(), "FN_REDIS_CHANNEL_PREFIX") {
			t.Errorf("FN_REDIS_CHANNEL_PREFIX=%q: %v, want an error naming it", bad, err)
		}
	}

	prefix := "fn-test-prefix-" + strings.ToLower(rand.Text()) + ":"
	cfg, err := config.FromEnv(env(map[string]string{"FN_REDIS_CHANNEL_PREFIX": prefix}))
	if err != nil || cfg.RedisChannelPrefix != prefix {
		t.Fatalf("FN_REDIS_CHANNEL_PREFIX=%q: read %q (%v)", prefix, cfg.RedisChannelPrefix, err)
	}
	cfg.RelayReplicas, cfg.RedisURL = 2, servicetest.RedisURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hub, release, err := openHub(ctx, cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		hub.Close()
		release()
	}()
	rh, ok := hub.(*wakeredis.Hub)
	if !ok {
		t.Fatalf("hub %T, want Redis's", hub)
	}
	for _, ch := range rh.Channels() {
		if !strings.HasPrefix(ch, prefix) {
			t.Fatalf("channel %q does not start with FN_REDIS_CHANNEL_PREFIX %q", ch, prefix)
		}
	}
}
