package main

import (
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/loadtest/report"
)

func TestSteadyState(t *testing.T) {
	start := time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	end := start.Add(10 * time.Second)
	var samples []sample
	for i := 0; i <= 11; i++ {
		// Memory grows through the first half and settles; one collection
		// spike in the second half must not decide the figure.
		rss := int64(100 + 10*min(i, 5))
		if i == 8 {
			rss = 900
		}
		samples = append(samples, sample{at: start.Add(time.Duration(i) * time.Second), held: 1000 - max(0, 5-i), rss: rss})
	}
	got := steadyState(samples, start, end)
	want := &report.Steady{FromSeconds: 5, ToSeconds: 10, Samples: 6, HeldPolls: 1000, RSSBytes: 150}
	if got == nil || *got != *want {
		t.Errorf("steady = %+v, want %+v", got, want)
	}
	if steadyState(samples[:3], start, end) != nil {
		t.Error("a steady state from the first half only")
	}
}

func TestParseConnectedClients(t *testing.T) {
	info := "# Clients\r\nconnected_clients:37\r\ncluster_connections:0\r\nmaxclients:10000\r\n"
	if n, err := parseConnectedClients(info); err != nil || n != 37 {
		t.Errorf("got %d, %v; want 37", n, err)
	}
	if _, err := parseConnectedClients("# Clients\r\nmaxclients:10000\r\n"); err == nil {
		t.Error("no connected_clients, no error")
	}
}

// TestRedeliveryNote: a run with explicit acks and crashes that saw no
// redelivery says why; with cursor acks, or with redeliveries, it says
// nothing.
func TestRedeliveryNote(t *testing.T) {
	fill := func(ack string, crashes []report.Crash) string {
		res := &result{cfg: &config{ackMode: ack, duration: time.Second}, crashes: crashes,
			refused: map[string]int{}, errors: map[string]int{}}
		rep := &report.Report{}
		res.fill(rep)
		return rep.RedeliveryNote
	}
	if n := fill("explicit", []report.Crash{{AtSeconds: 2, AcksAtRisk: 0}}); n == "" || !strings.Contains(n, "no acknowledgement") {
		t.Errorf("no acks at risk: note %q", n)
	}
	if n := fill("explicit", []report.Crash{{AtSeconds: 2, AcksAtRisk: 3}, {AtSeconds: 4, AcksAtRisk: 1}}); !strings.Contains(n, "4 acknowledgements") || !strings.Contains(n, "2.0 s, 4.0 s") {
		t.Errorf("acks at risk: note %q", n)
	}
	if n := fill("cursor", []report.Crash{{AtSeconds: 2}}); n != "" {
		t.Errorf("cursor acks: note %q", n)
	}
	if n := fill("explicit", nil); n != "" {
		t.Errorf("no crash: note %q", n)
	}
}
