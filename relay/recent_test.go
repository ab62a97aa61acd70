package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/wake"
)

// TestRecentIsBounded: kept envelopes go after recentFor, past recentBytes
// the oldest go first, and a device's removal drops its own. Without the
// byte bound, 64 MiB of payloads stayed in memory (tried).
func TestRecentIsBounded(t *testing.T) {
	var r recent
	now := time.Unix(1_800_000_000, 0)
	k := wake.Key{Household: "h", Device: "d"}
	payload := make([]byte, 1<<20)
	for i := range 64 {
		r.put(k, store.Envelope{Seq: int64(i + 1), Payload: payload}, device.Life{}, now)
	}
	if r.bytes > recentBytes {
		t.Fatalf("%d bytes kept, bound %d", r.bytes, recentBytes)
	}
	if _, ok := r.get(k, 1, device.Life{}, now); ok {
		t.Fatal("the oldest envelope was kept past the byte bound")
	}
	if _, ok := r.get(k, 64, device.Life{}, now); !ok {
		t.Fatal("the newest envelope was not kept")
	}
	if _, ok := r.get(k, 64, device.Life{}, now.Add(recentFor+time.Second)); ok {
		t.Fatal("an envelope was handed out after recentFor")
	}
	r.forget(k)
	if _, ok := r.get(k, 64, device.Life{}, now); ok {
		t.Fatal("a removed device's envelope was kept")
	}
	r.put(wake.Key{Household: "h", Device: "other"}, store.Envelope{Seq: 1}, device.Life{}, now.Add(recentFor+time.Second))
	if len(r.order) != 1 {
		t.Fatalf("%d entries after every old one expired, want 1", len(r.order))
	}
}

// TestHouseholdBucketsAreBounded: buckets of households that stopped
// sending (full again) are forgotten once the map passes bucketsSweep, so
// memory follows the households sending now. Without the sweep the map
// held every household ever seen (tried).
func TestHouseholdBucketsAreBounded(t *testing.T) {
	h := newBuckets[string](10, 5)
	now := time.Unix(1_800_000_000, 0)
	for i := range 3 * bucketsSweep {
		// Each household sends once, then a second passes: full again.
		h.allow(fmt.Sprint("h", i), now.Add(time.Duration(i)*time.Second))
	}
	if n := len(h.m); n > bucketsSweep+1 {
		t.Fatalf("%d household buckets kept, sweep at %d", n, bucketsSweep)
	}
}
