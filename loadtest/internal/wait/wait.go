// Package wait is the load tester's sleep: one that ends early when its
// context does, and says which happened.
package wait

import (
	"context"
	"time"
)

// For waits d or until ctx ends; it reports whether d passed. A d of zero
// or less returns at once, reporting whether ctx is still live.
func For(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Until waits for t or until ctx ends; it reports whether t was reached.
func Until(ctx context.Context, t time.Time) bool {
	return For(ctx, time.Until(t))
}
