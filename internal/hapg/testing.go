package hapg

import (
	"context"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/servicetest"
)

// Start starts a formation for a test and ends it when the test ends. A
// machine without pg_autoctl skips the test, or fails it under
// FN_TEST_REQUIRE_SERVICES=1.
func Start(tb testing.TB, mode Mode) *Formation {
	tb.Helper()
	if err := Missing(); err != nil {
		servicetest.Unavailable(tb, "pg_autoctl and the pgautofailover extension", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f, err := Launch(ctx, Config{Mode: mode})
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
