package main

import (
	"strings"
	"testing"

	"github.com/flamenet/relay/loadtest/report"
)

// TestRenderFailover: a -failover run has its row in the failover table,
// and, not being an ordinary run, never stands in the comparison with the
// original relay (dropping Failover from Config.Plain turned this red).
func TestRenderFailover(t *testing.T) {
	fo := sample("pg-failover-sync-1000x100", "postgres", 1000, 100)
	fo.Config.Failover = "sync"
	fo.Failover = &report.Failover{Mode: "sync", AtSeconds: 20.004, PromotedMS: 9123.4, FirstDeliveryMS: 8500,
		SendsRefused: map[string]int{"503 unavailable": 812, "timeout": 3}, Primary: "node1", Promoted: "node2"}
	async := sample("pg-failover-async-1000x100", "postgres", 1000, 100)
	async.Config.Failover = "async"
	async.OK = false
	async.Lost = 180
	async.Failover = &report.Failover{Mode: "async", AtSeconds: 20, CutMS: 2000, Error: "hapg: waiting for a new primary: timed out"}
	got := renderFixture(t, map[string]*report.Report{
		"pg-failover-sync-1000x100.json": fo, "pg-failover-async-1000x100.json": async,
	})
	for _, want := range []string{
		"#### Failover",
		"| pg-failover-sync-1000x100 | 1 | 1,000 | 100/s | sync | 20.0 s | 9.12 s | 8.50 s | 503 unavailable: 812; timeout: 3 | 6,000 | 6,000 | 0 | 0 | 0 |",
		"| pg-failover-async-1000x100 (FAIL) | 1 | 1,000 | 100/s | async, replication cut 2.00 s before | 20.0 s | not promoted | none | 0 | 6,000 | 6,000 | 180 | 0 | 0 |",
		"| 1,000 | 100/s | 18 ms / 38 ms / 1.0 s | not run | not run |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("page lacks %q\n%s", want, got)
		}
	}
}
