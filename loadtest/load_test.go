package main

import (
	"crypto/ed25519"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/flamenet/relay/loadtest/report"
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

// TestProgressLatencies: a progress line prints the latency as the
// summary does; sub-millisecond samples read 0.1 ms in both, not 0s in
// one. Seen red when progress rounded to the millisecond.
func TestProgressLatencies(t *testing.T) {
	samples := []time.Duration{80 * time.Microsecond, 100 * time.Microsecond, 120 * time.Microsecond, 2500 * time.Microsecond}
	p50, p99 := progressLatencies(slices.Clone(samples))
	s := report.Summarize(samples)
	if want := report.FormatMS(s.P50); p50 != want || p50 != "0.1 ms" {
		t.Errorf("progress p50 %q, summary %q", p50, want)
	}
	if want := report.FormatMS(s.P99); p99 != want {
		t.Errorf("progress p99 %q, summary %q", p99, want)
	}
	if p50, p99 := progressLatencies(nil); p50 != "" || p99 != "" {
		t.Errorf("no samples: %q %q", p50, p99)
	}
}

// TestRequestTimeoutStreams: a stream run's requests have no client
// Timeout, which would cut every stream at it (seen: all 5,000 streams
// cut together 50 s into a run); a poll run's outlasts a held poll.
func TestRequestTimeoutStreams(t *testing.T) {
	if d := requestTimeout(&config{wait: 20, stream: true}); d != 0 {
		t.Errorf("stream run: timeout %v, want none", d)
	}
	if d := requestTimeout(&config{wait: 20}); d <= 20*time.Second {
		t.Errorf("poll run: timeout %v, not above the 20 s wait", d)
	}
}
