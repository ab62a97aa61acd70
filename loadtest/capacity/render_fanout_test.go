package main

import (
	"strings"
	"testing"

	"github.com/flamenet/relay/loadtest/report"
)

func TestRenderFanout(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	half := func(wakes []report.RelayWakes) *report.Report {
		return &report.Report{Accepted: 500, HeldPolls: 100, Wakes: wakes}
	}
	everyone := []report.RelayWakes{
		{Relay: 0, Received: f(740), Unheld: f(490)}, {Relay: 1, Received: f(760), Unheld: f(510)},
	}
	routed := []report.RelayWakes{
		{Relay: 0, Received: f(240), Unheld: f(0), SubscriptionsEnd: f(50)}, {Relay: 1, Received: f(260), Unheld: f(2), SubscriptionsEnd: f(51)},
	}
	runs := []fanoutRun{
		{setup: "single", side: "before", a: half(everyone), b: half(everyone)},
		{setup: "single", side: "after", a: half(routed), b: half(routed)},
	}
	runs[1].redis.RelayCommit = "0123456789abcdef"
	runs[1].redis.Sum.PubsubCalls = map[string]int64{"publish": 1000, "subscribe": 30}
	runs[1].redis.Sum.Peaks = map[string]int64{"pubsub_channels": 116}
	runs[1].steady = &redisFigures{WindowSeconds: 50}
	runs[1].steady.Sum.PubsubCalls = map[string]int64{"publish": 900}
	var b strings.Builder
	renderFanout(&b, runs)
	got := b.String()
	for _, want := range []string{
		"| single | before |  | 200 | 1,000 | 740 – 760 | 76 % | 67 % | none (shard channels) | 0 | 0 |",
		"| single | after | 0123456 | 200 | 1,000 | 240 – 260 | 26 % | 0 % | 50 – 51 | 0 | 0 |",
		"| single | after | all | 0.00 s | 0 MB | 0 MB | 0 | 1,000 | 30 | 0 | 116 |  |",
		"| single | after | sends alone (50 s) | 0.00 s | 0 MB | 0 MB | 0 | 900 | 0 | 0 | – |  |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing row %q in:\n%s", want, got)
		}
	}
	b.Reset()
	renderFanout(&b, nil)
	if b.Len() != 0 {
		t.Errorf("no runs rendered %q", b.String())
	}
}
