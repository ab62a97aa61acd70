package accesslog

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestRefusalLinesSummary: the summary comes when the second ends, even
// with no request after it.
func TestRefusalLinesSummary(t *testing.T) {
	reported := make(chan int, 4)
	l := refusalLines{perSecond: 3, report: func(n int) { reported <- n }}
	now := time.Now()
	for i := range 10 {
		if got, want := l.allow(now), i < 3; got != want {
			t.Fatalf("refusal %d: allowed %v, want %v", i, got, want)
		}
	}
	select {
	case n := <-reported:
		if n != 7 {
			t.Fatalf("summary says %d dropped, want 7", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no summary after the second ended")
	}
	if !l.allow(time.Now().Add(2 * time.Second)) {
		t.Fatal("a new second refused its first line")
	}
	select {
	case n := <-reported:
		t.Fatalf("a second summary of %d", n)
	default:
	}
}

// TestClientAddr: X-Forwarded-For is believed only from a trusted peer,
// walked from the right past trusted proxies; junk in it never becomes the
// client.
func TestClientAddr(t *testing.T) {
	lan := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	tests := []struct {
		name, remote string
		xff          []string
		trusted      []netip.Prefix
		want         string
	}{
		{"no proxies trusted", "203.0.113.5:4000", []string{"198.51.100.1"}, nil, "203.0.113.5"},
		{"untrusted peer spoofs", "203.0.113.5:4000", []string{"198.51.100.1"}, lan, "203.0.113.5"},
		{"trusted peer", "10.0.0.2:4000", []string{"198.51.100.1"}, lan, "198.51.100.1"},
		{"trusted peer without XFF", "10.0.0.2:4000", nil, lan, "10.0.0.2"},
		{"client spoofs left of proxy", "10.0.0.2:4000", []string{"1.2.3.4, 198.51.100.1"}, lan, "198.51.100.1"},
		{"chain of proxies", "10.0.0.2:4000", []string{"1.2.3.4, 198.51.100.1, 10.0.0.9"}, lan, "198.51.100.1"},
		{"several headers", "10.0.0.2:4000", []string{"1.2.3.4", "198.51.100.1", "10.0.0.9"}, lan, "198.51.100.1"},
		{"all trusted", "10.0.0.2:4000", []string{"10.0.0.7, 10.0.0.9"}, lan, "10.0.0.7"},
		{"junk entry stops the walk", "10.0.0.2:4000", []string{"1.2.3.4, unknown"}, lan, "10.0.0.2"},
		{"junk behind a proxy", "10.0.0.2:4000", []string{"1.2.3.4, <script>, 10.0.0.9"}, lan, "10.0.0.9"},
		{"empty entries", "10.0.0.2:4000", []string{"198.51.100.1,, ,"}, lan, "198.51.100.1"},
		{"entry with port", "10.0.0.2:4000", []string{"198.51.100.1:5555"}, lan, "198.51.100.1"},
		{"IPv6", "[fd00::1]:4000", []string{"2001:db8::7"}, lan, "2001:db8::7"},
		{"IPv6 with port", "[fd00::1]:4000", []string{"[2001:db8::7]:80"}, lan, "2001:db8::7"},
		{"mapped peer", "[::ffff:10.0.0.2]:4000", []string{"198.51.100.1"}, lan, "198.51.100.1"},
		{"mapped entry", "10.0.0.2:4000", []string{"::ffff:198.51.100.1"}, lan, "198.51.100.1"},
		{"zone", "10.0.0.2:4000", []string{"fe80::1%eth0"}, lan, "10.0.0.2"},
		{"huge header", "10.0.0.2:4000", []string{strings.Repeat("x", 10000)}, lan, "10.0.0.2"},
		{"no port on peer", "pipe", []string{"198.51.100.1"}, lan, "pipe"},
	}
	for _, tt := range tests {
		if got := ClientAddr(tt.remote, tt.xff, tt.trusted); got != tt.want {
			t.Errorf("%s: ClientAddr(%q, %q) = %q, want %q", tt.name, tt.remote, tt.xff, got, tt.want)
		}
	}
}

// BenchmarkAccessLine is the line alone: what Write costs once a
// request is answered (JSON to io.Discard).
func BenchmarkAccessLine(b *testing.B) {
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	a := New(log, log)
	line := Line{
		Method: "GET", Route: "/v1/poll", Status: 200, Took: 57 * time.Second, Bytes: 44,
		Client: ClientAddr("127.0.0.1:5000", nil, nil), Household: "home", Device: "phone", Outcome: "empty",
		Query: "cursor=12&wait=60",
	}
	b.ReportAllocs()
	for b.Loop() {
		a.Write(context.Background(), line)
	}
}
