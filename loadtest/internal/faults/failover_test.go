package faults

import (
	"testing"
	"time"

	"github.com/flamenet/relay/internal/hapg"
	"github.com/flamenet/relay/loadtest/internal/check"
)

// TestFailoverSummary: deliveries resume at the first delivery of a send
// first tried after the kill, not of one that was in flight across it;
// only the sends' attempts retried or refused within the failover's window
// count as refused.
func TestFailoverSummary(t *testing.T) {
	start := time.Now()
	killed := start.Add(10 * time.Second)
	fo := &Failover{mode: hapg.Sync, killed: killed, promoted: killed.Add(8 * time.Second), windowEnd: killed.Add(10 * time.Second), primary: "node1", promotedNode: "node2"}
	res := &check.Result{
		Start: start,
		Sends: []check.Send{
			{Pair: 0, Started: killed.Add(-time.Second)}, // in flight across the kill
			{Pair: 0, Started: killed.Add(time.Second)},
			{Pair: 0, Started: killed.Add(2 * time.Second)},
			{Pair: 0, Started: killed.Add(3 * time.Second), Answered: killed.Add(4 * time.Second), Outcome: check.Refused},
			{Pair: 0, Started: killed.Add(-3 * time.Second), Answered: killed.Add(-2 * time.Second), Outcome: check.Refused}, // before
			{Pair: 0, Started: killed.Add(11 * time.Second), Answered: killed.Add(11 * time.Second), Outcome: check.Refused}, // after
		},
		Recipients: []*check.Recipient{{Idx: 0, Received: []check.Arrival{
			{Send: 0, At: killed.Add(5 * time.Second)},
			{Send: 1, At: killed.Add(9 * time.Second)},
			{Send: 2, At: killed.Add(9500 * time.Millisecond)},
			{Send: -1, At: killed.Add(6 * time.Second)},
		}}},
		Retried: map[string]int{"send 503 unavailable": 7, "send transport": 2, "poll 503 unavailable": 5},
	}
	s := fo.Summary(res)
	if s.FirstDeliveryMS != 9000 || s.PromotedMS != 8000 || s.AtSeconds != 10 {
		t.Errorf("first delivery %v ms, promoted %v ms, at %v s; want 9000, 8000, 10", s.FirstDeliveryMS, s.PromotedMS, s.AtSeconds)
	}
	if len(s.SendsRefused) != 3 || s.SendsRefused["503 unavailable"] != 7 || s.SendsRefused["transport"] != 2 || s.SendsRefused[refusedNotRetried] != 1 {
		t.Errorf("sends refused %v", s.SendsRefused)
	}
}
