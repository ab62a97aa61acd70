package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/hapg"
)

func TestFailoverConfig(t *testing.T) {
	c, err := parseConfig([]string{"-failover", "sync", "-duration", "30s"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.store != "postgres" || c.failoverAt != 10*time.Second {
		t.Errorf("-failover sync: store %q, at %v; want postgres and a third of the duration", c.store, c.failoverAt)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"mode", []string{"-failover", "maybe"}, "sync or async"},
		{"sqlite", []string{"-failover", "sync", "-store", "sqlite"}, "-failover needs -store postgres"},
		{"pg", []string{"-failover", "sync", "-pg", "postgres://x@127.0.0.1/y"}, "-pg cannot be given"},
		{"crash", []string{"-failover", "sync", "-crash", "5s"}, "cannot be given with -faults or -crash"},
		{"late", []string{"-failover", "sync", "-duration", "10s", "-failover-at", "10s"}, "inside the offered duration"},
		{"async too early", []string{"-failover", "async", "-failover-at", "1s"}, "cuts replication"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig(tc.args, env(nil), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestFailoverSummary: deliveries resume at the first delivery of a send
// first tried after the kill, not of one that was in flight across it;
// only the sends' attempts retried or refused within the failover's window
// count as refused.
func TestFailoverSummary(t *testing.T) {
	start := time.Now()
	killed := start.Add(10 * time.Second)
	fo := &failover{mode: hapg.Sync, killed: killed, promoted: killed.Add(8 * time.Second), windowEnd: killed.Add(10 * time.Second), primary: "node1", promotedNode: "node2"}
	res := &result{
		start: start,
		sends: []sendRecord{
			{pair: 0, started: killed.Add(-time.Second)}, // in flight across the kill
			{pair: 0, started: killed.Add(time.Second)},
			{pair: 0, started: killed.Add(2 * time.Second)},
			{pair: 0, started: killed.Add(3 * time.Second), answered: killed.Add(4 * time.Second), outcome: refused},
			{pair: 0, started: killed.Add(-3 * time.Second), answered: killed.Add(-2 * time.Second), outcome: refused}, // before
			{pair: 0, started: killed.Add(11 * time.Second), answered: killed.Add(11 * time.Second), outcome: refused}, // after
		},
		pairs: []*pair{{idx: 0, received: []received{
			{send: 0, at: killed.Add(5 * time.Second)},
			{send: 1, at: killed.Add(9 * time.Second)},
			{send: 2, at: killed.Add(9500 * time.Millisecond)},
			{send: -1, at: killed.Add(6 * time.Second)},
		}}},
		retried: map[string]int{"send 503 unavailable": 7, "send transport": 2, "poll 503 unavailable": 5},
	}
	s := fo.summary(res)
	if s.FirstDeliveryMS != 9000 || s.PromotedMS != 8000 || s.AtSeconds != 10 {
		t.Errorf("first delivery %v ms, promoted %v ms, at %v s; want 9000, 8000, 10", s.FirstDeliveryMS, s.PromotedMS, s.AtSeconds)
	}
	if len(s.SendsRefused) != 3 || s.SendsRefused["503 unavailable"] != 7 || s.SendsRefused["transport"] != 2 || s.SendsRefused[refusedNotRetried] != 1 {
		t.Errorf("sends refused %v", s.SendsRefused)
	}
}
