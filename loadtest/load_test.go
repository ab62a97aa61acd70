package main

import (
	"crypto/ed25519"
	"io"
	"log/slog"
	"testing"
	"time"
)

func testRunner(t *testing.T, urls []string, pairs int) *runner {
	t.Helper()
	cfg := &config{pairs: pairs, rate: 10, duration: time.Second, wait: 2, payload: 64, codec: "json", drain: time.Second}
	r, err := newRunner(cfg, urls, ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.closeIdle)
	return r
}

// TestPairsCrossReplicas: with two relays every pair's sender is on the
// other relay than its recipient, and each relay holds half the polls.
func TestPairsCrossReplicas(t *testing.T) {
	r := testRunner(t, []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}, 10)
	held := map[string]int{}
	for _, p := range r.pairs {
		if p.sendRelay == p.pollRelay {
			t.Errorf("pair %d sends and polls on %s", p.idx, r.targets[p.pollRelay])
		}
		held[r.targets[p.pollRelay]]++
	}
	if held["http://127.0.0.1:1"] != 5 || held["http://127.0.0.1:2"] != 5 {
		t.Errorf("polls per relay = %v", held)
	}
	one := testRunner(t, []string{"http://127.0.0.1:1"}, 3)
	for _, p := range one.pairs {
		if p.sendRelay != p.pollRelay {
			t.Errorf("one relay: pair %d spread over two", p.idx)
		}
	}
}

func TestSendIndex(t *testing.T) {
	r := testRunner(t, []string{"http://127.0.0.1:1"}, 2)
	r.sends = make([]sendRecord, 5)
	other := testRunner(t, []string{"http://127.0.0.1:1"}, 2)
	for _, tc := range []struct {
		id   string
		want int
	}{
		{r.sendID(0), 0},
		{r.sendID(4), 4},
		{r.sendID(5), -1},     // beyond the schedule
		{other.sendID(1), -1}, // another run's send
		{r.tag + "-x", -1},    // not a number
		{"", -1},
	} {
		if got := r.sendIndex(tc.id); got != tc.want {
			t.Errorf("sendIndex(%q) = %d, want %d", tc.id, got, tc.want)
		}
	}
}
