package buckets

import (
	"fmt"
	"testing"
	"time"
)

// TestBucketsAreBounded: buckets of keys that went idle (full again) are
// forgotten once the map passes Sweep, so memory follows the keys active
// now. Without the sweep the map held every key ever seen (tried).
func TestBucketsAreBounded(t *testing.T) {
	h := New[string](10, 5)
	now := time.Unix(1_800_000_000, 0)
	for i := range 3 * Sweep {
		// Each household sends once, then a second passes: full again.
		h.Allow(fmt.Sprint("h", i), now.Add(time.Duration(i)*time.Second))
	}
	if n := len(h.m); n > Sweep+1 {
		t.Fatalf("%d household buckets kept, sweep at %d", n, Sweep)
	}
}
