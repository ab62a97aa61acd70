package report

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 1000; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{
		{50, 500 * time.Millisecond},
		{95, 950 * time.Millisecond},
		{99, 990 * time.Millisecond},
		{99.9, 999 * time.Millisecond},
		{100, 1000 * time.Millisecond},
		{0, time.Millisecond},
	} {
		if got := Percentile(s, tc.p); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := Percentile([]time.Duration{7}, 99.9); got != 7 {
		t.Errorf("one sample: %v", got)
	}
}

func TestSummarizeSortsAndKeepsEverySample(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 2000; i++ {
		s = append(s, time.Duration(i)*time.Microsecond*500)
	}
	rand.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	got := Summarize(s)
	want := Summary{N: 2000, P50: 500, P95: 950, P99: 990, P999: 999, Max: 1000}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if (Summarize(nil) != Summary{}) {
		t.Error("empty samples gave figures")
	}
	if neg := Summarize([]time.Duration{-time.Millisecond, time.Millisecond}); neg.P50 != -1 {
		t.Errorf("a negative sample must stay negative: %+v", neg)
	}
}

func TestWriteRead(t *testing.T) {
	r := &Report{Name: "x", Date: time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC), OK: true,
		Errors: map[string]int{"poll transport": 1}, LatencyMS: Latencies{SendRequest: Summary{N: 1, P50: 1.5}}}
	p := filepath.Join(t.TempDir(), "r.json")
	if err := Write(p, r); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Errorf("round trip: got %+v, want %+v", got, r)
	}
}

// TestEvidenceCompatible: every committed report reads, with no cursor_ahead
// or resync, and writes back without those fields; a report with them
// says so in its line.
func TestEvidenceCompatible(t *testing.T) {
	paths, err := filepath.Glob("../../docs/evidence/*.json")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no evidence: %v", err)
	}
	for _, p := range paths {
		r, err := Read(p)
		if err != nil {
			t.Fatal(err)
		}
		if r.CursorAhead != 0 || r.Resyncs != 0 {
			t.Errorf("%s: cursor_ahead %d, resyncs %d", p, r.CursorAhead, r.Resyncs)
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(`"cursor_ahead"`)) || bytes.Contains(b, []byte(`"resyncs"`)) {
			t.Errorf("%s: written back with the new fields", p)
		}
	}
	r := &Report{Name: "x", CursorAhead: 3, Resyncs: 2}
	if l := r.Line(); !strings.Contains(l, "cursor_ahead=3 resyncs=2") {
		t.Errorf("line %q", l)
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want string
	}{{0.35, "0.3 ms"}, {4.96, "5.0 ms"}, {12.4, "12 ms"}, {325, "325 ms"}, {1000, "1.00 s"}, {2600, "2.60 s"}} {
		if got := FormatMS(tc.v); got != tc.want {
			t.Errorf("FormatMS(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
	if got := FormatBytes(83_400_000); got != "83 MB" {
		t.Errorf("FormatBytes = %q", got)
	}
}

func TestPlain(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		want bool
	}{
		{"older report", Config{}, true},
		{"cursor acks", Config{AckMode: "cursor"}, true},
		{"explicit acks", Config{AckMode: "explicit"}, false},
		{"crash", Config{CrashAtSeconds: []float64{20}}, false},
		{"fault campaign", Config{Faults: "0"}, false},
		{"hostile", Config{Hostile: 1}, false},
		{"memory cap", Config{RelayMemoryBytes: 1 << 28}, false},
		{"relay settings", Config{RelayEnv: []string{"FN_ACK_INTERVAL=1s"}}, false},
	} {
		if got := tc.c.Plain(); got != tc.want {
			t.Errorf("%s: Plain() = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestWakes: a value a relay did not export stays absent through the JSON,
// not 0, while a measured 0 stays 0; the lines after the summary leave the
// absent out, and a report without wakes has none.
func TestWakes(t *testing.T) {
	zero, n := 0.0, 1234.0
	r := &Report{Name: "x", Wakes: []RelayWakes{
		{Relay: 0, Received: &n, Unheld: &zero, SubscriptionsEnd: &n},
		{Relay: 1},
	}}
	b, err := json.Marshal(r.Wakes)
	if err != nil {
		t.Fatal(err)
	}
	if want := `[{"relay":0,"received":1234,"unheld":0,"subscriptions_end":1234},{"relay":1}]`; string(b) != want {
		t.Errorf("json %s, want %s", b, want)
	}
	p := filepath.Join(t.TempDir(), "r.json")
	if err := Write(p, r); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Wakes, r.Wakes) || got.Wakes[1].Received != nil || got.Wakes[0].Subscribes != nil {
		t.Errorf("round trip: got %+v, want %+v", got.Wakes, r.Wakes)
	}
	want := []string{"relay 0: wakes received=1234 unheld=0 subscriptions=1234", "relay 1: wakes"}
	if l := r.WakeLines(); !reflect.DeepEqual(l, want) {
		t.Errorf("lines %q, want %q", l, want)
	}
	r.Wakes = nil
	if l := r.WakeLines(); l != nil {
		t.Errorf("lines without wakes: %q", l)
	}
	if b, _ := json.Marshal(r); bytes.Contains(b, []byte(`"wakes"`)) {
		t.Errorf("a report without wakes has the field: %s", b)
	}
}
