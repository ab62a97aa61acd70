package memory

import (
	"bytes"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

// TestRecentIsBounded: kept envelopes go after recentFor, past recentBytes
// the oldest go first, and a device's removal drops its own. Without the
// byte bound, 64 MiB of payloads stayed in memory (tried).
func TestRecentIsBounded(t *testing.T) {
	var r recent
	now := time.Unix(1_800_000_000, 0)
	k := device.Key{Household: "h", Device: "d"}
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
	r.put(device.Key{Household: "h", Device: "other"}, store.Envelope{Seq: 1}, device.Life{}, now.Add(recentFor+time.Second))
	if len(r.order) != 1 {
		t.Fatalf("%d entries after every old one expired, want 1", len(r.order))
	}
}

func TestEnvelopeEncoding(t *testing.T) {
	e := store.Envelope{Seq: 42, ID: "id-1", From: "laptop", SentAt: time.UnixMicro(1_800_000_000_123_456).UTC(), Payload: []byte("payload\x00bytes")}
	b := EncodeEnvelope(e)
	got, err := decodeEnvelope(b)
	if err != nil || got.Seq != e.Seq || got.ID != e.ID || got.From != e.From || !got.SentAt.Equal(e.SentAt) || !bytes.Equal(got.Payload, e.Payload) {
		t.Fatalf("round trip = %+v %v", got, err)
	}
	for n := range len(b) - len(e.Payload) {
		if _, err := decodeEnvelope(b[:n]); err == nil {
			t.Fatalf("an envelope cut to %d bytes decoded", n)
		}
	}
}
