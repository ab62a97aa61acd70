package redis

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
)

// RouteLogs sends go-redis's own log lines ("failed to dial", pool and
// reconnect notes) to log at debug level, at most a few per
// logEvery, counting the ones it drops. Without it go-redis writes them
// unstructured to stderr, one per failed dial, which during an outage is
// many a second. The hub's own lines (one per outage and one per recovery)
// say what an operator needs; these are for debugging.
//
// go-redis keeps one logger per process, so this is global: call it once,
// from main.
func RouteLogs(log *slog.Logger) {
	goredis.SetLogger(&routedLogger{
		log:   log,
		limit: rate.NewLimiter(rate.Every(logEvery), logBurst),
	})
}

const (
	logEvery = 10 * time.Second
	logBurst = 5
)

type routedLogger struct {
	log   *slog.Logger
	limit *rate.Limiter

	mu      sync.Mutex
	dropped int
}

func (l *routedLogger) Printf(ctx context.Context, format string, v ...any) {
	if !l.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	if !l.limit.Allow() {
		l.mu.Lock()
		l.dropped++
		l.mu.Unlock()
		return
	}
	l.mu.Lock()
	dropped := l.dropped
	l.dropped = 0
	l.mu.Unlock()
	msg := strings.TrimSpace(fmt.Sprintf(format, v...))
	if dropped > 0 {
		l.log.DebugContext(ctx, msg, "source", "go-redis", "suppressed", dropped)
		return
	}
	l.log.DebugContext(ctx, msg, "source", "go-redis")
}
