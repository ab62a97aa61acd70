package redis

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"golang.org/x/time/rate"
)

// go-redis's lines come out as structured debug lines, a few at most in a
// burst, and not at all above debug level.
func TestRoutedLogger(t *testing.T) {
	var buf bytes.Buffer
	l := &routedLogger{
		log:   slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
		limit: rate.NewLimiter(rate.Every(logEvery), logBurst),
	}
	for range 50 {
		l.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %s", 1, "refused")
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != logBurst {
		t.Fatalf("%d lines for 50 go-redis lines in a burst, want %d:\n%s", len(lines), logBurst, buf.String())
	}
	if !strings.Contains(lines[0], "level=DEBUG") || !strings.Contains(lines[0], `msg="redis: connection pool: failed to dial after 1 attempts: refused"`) ||
		!strings.Contains(lines[0], "source=go-redis") {
		t.Fatalf("line = %s", lines[0])
	}
	l.limit = rate.NewLimiter(rate.Inf, 1) // time has passed
	l.Printf(context.Background(), "again")
	if !strings.Contains(buf.String(), "suppressed=45") {
		t.Fatalf("the next line does not count the 45 dropped:\n%s", buf.String())
	}

	buf.Reset()
	l.log = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	l.Printf(context.Background(), "redis: connection pool: failed to dial")
	if buf.Len() != 0 {
		t.Fatalf("a line at info level: %s", buf.String())
	}
}
