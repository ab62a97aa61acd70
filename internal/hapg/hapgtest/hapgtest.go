// Package hapgtest starts a highly available Postgres (internal/hapg) for a
// test, and ends it when the test ends.
package hapgtest

import (
	"context"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/hapg"
	"github.com/flamenet/relay/internal/servicetest"
)

// Start starts a formation for a test and ends it when the test ends. A
// machine without pg_autoctl skips the test, or fails it under
// FN_TEST_REQUIRE_SERVICES=1.
func Start(tb testing.TB, mode hapg.Mode) *hapg.Formation {
	tb.Helper()
	if err := hapg.Missing(); err != nil {
		servicetest.Unavailable(tb, "pg_autoctl and the pgautofailover extension", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f, err := hapg.Launch(ctx, hapg.Config{Mode: mode})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := f.Close(); err != nil {
			tb.Errorf("hapg: close: %v", err)
		}
	})
	return f
}
