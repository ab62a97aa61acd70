package meter

import (
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
