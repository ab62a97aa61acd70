// Package servicetest finds the Postgres and Redis servers that tests run
// against. Tests find them through FN_TEST_DATABASE_URL and
// FN_TEST_REDIS_URL, defaulting to the local servers. An unreachable server
// skips the test, naming the variable, unless FN_TEST_REQUIRE_SERVICES=1,
// where it fails: a suite that skips silently in CI is worse than none.
package servicetest

import (
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/config"
)

const (
	defaultPostgres = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	defaultRedis    = "redis://127.0.0.1:6379/0"
)

// PostgresURL returns the URL of a reachable Postgres server (an
// administrative database; tests create their own schema or database).
func PostgresURL(tb testing.TB) string {
	tb.Helper()
	raw := reachable(tb, "FN_TEST_DATABASE_URL", defaultPostgres)
	// Read as the relay reads FN_DATABASE_URL, so a test never runs on a
	// URL the relay would refuse.
	if db, err := config.ParseDatabaseURL(raw); err != nil || db.Kind != config.Postgres {
		tb.Fatalf("FN_TEST_DATABASE_URL: want a postgres:// URL (%v)", err)
	}
	return raw
}

// RedisURL returns the URL of a reachable Redis server. Tests use a key
// prefix of their own and never FLUSHDB.
func RedisURL(tb testing.TB) string {
	tb.Helper()
	return reachable(tb, "FN_TEST_REDIS_URL", defaultRedis)
}

// Required reports whether FN_TEST_REQUIRE_SERVICES=1.
func Required() bool { return os.Getenv("FN_TEST_REQUIRE_SERVICES") == "1" }

// Unavailable skips the test, or fails it when services are required.
func Unavailable(tb testing.TB, variable string, err error) {
	tb.Helper()
	if Required() {
		tb.Fatalf("%s: service unreachable and FN_TEST_REQUIRE_SERVICES=1: %v", variable, err)
	}
	tb.Skipf("%s: service unreachable (%v); set it to run this test", variable, err)
}

func reachable(tb testing.TB, variable, def string) string {
	tb.Helper()
	raw := os.Getenv(variable)
	if raw == "" {
		raw = def
	}
	u, err := url.Parse(raw)
	if err != nil {
		tb.Fatalf("%s: %v", variable, err)
	}
	host := u.Host
	if u.Port() == "" {
		port := "5432"
		if u.Scheme == "redis" || u.Scheme == "rediss" {
			port = "6379"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	c, err := net.DialTimeout("tcp", host, 2*time.Second)
	if err != nil {
		Unavailable(tb, variable, err)
		return ""
	}
	c.Close()
	return raw
}
