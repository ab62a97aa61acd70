package relay

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestExpirer: envelopes older than the TTL disappear and are counted;
// younger ones stay.
func TestExpirer(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	h.send(phone, "old", []byte("x"), "phone")
	h.send(phone, "young", []byte("y"), "phone")

	e, err := NewExpirer(h.db, time.Hour, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	// Both envelopes are seconds old: nothing is due yet.
	if res, err := e.Once(context.Background()); err != nil || res.Envelopes != 0 {
		t.Fatalf("Once = %+v, %v", res, err)
	}
	// Two hours on, both are past the TTL.
	e.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if res, err := e.Once(context.Background()); err != nil || res.Envelopes != 2 {
		t.Fatalf("Once two hours on = %+v, %v", res, err)
	}
	if got := testutil.ToFloat64(e.envelopes); got != 2 {
		t.Fatalf("fn_expired_envelopes_total = %v", got)
	}
	// The device learns from the first seq above its cursor that two
	// envelopes expired unread: here nothing is left and the cursor stays.
	if p := h.poll(phone, ""); len(p.Envelopes) != 0 || p.Cursor != 0 {
		t.Fatalf("poll after expiry = %+v", p)
	}
	h.send(phone, "next", []byte("z"), "phone")
	if p := h.poll(phone, ""); len(p.Envelopes) != 1 || p.Envelopes[0].Seq != 3 {
		t.Fatalf("next envelope = %+v, want seq 3 (1 and 2 expired)", p)
	}
}
