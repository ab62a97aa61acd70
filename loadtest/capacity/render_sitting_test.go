package main

import (
	"strings"
	"testing"

	"github.com/flamenet/relay/loadtest/report"
)

// TestRenderSitting: each kind of run of the sitting gets the median over
// its rounds of CPU per delivered message, their range, and the median's
// ratio to this checkout's polls'; without this checkout's polls and
// streams there is no table.
func TestRenderSitting(t *testing.T) {
	run := func(name string, cpu float64) entry {
		r := &report.Report{Name: name, OK: true, Delivered: 30000, Relay: report.Relay{Source: "proc", CPUSeconds: cpu}}
		if strings.Contains(name, "-stream") {
			r.Config.Transport = "stream"
		}
		return entry{file: name + ".json", r: r}
	}
	before := func(round string, cpu float64) entry {
		e := run("pg-herd-5000x500-5a87271-"+round, cpu)
		e.r.Git = report.Git{Commit: "5ccd675f0157b3916f492e580bb0032ef6582a99"}
		e.r.Relay.Git = &report.Git{Commit: "5a87271f3d0a"}
		return e
	}
	s := sitting{
		relay: []entry{
			before("r1", 22.5), before("r2", 24), before("r3", 21),
			run(sittingPolls+"-r1", 21), run(sittingPolls+"-r2", 18), run(sittingPolls+"-r3", 24),
			run(sittingStreams+"-r1", 15), run(sittingStreams+"-r2", 13.5), run(sittingStreams+"-r3", 16.5),
		},
		peers: []peer{
			{file: "centrifugo-herd-5000x500-r1.json", Commit: "f25c7abd0701195829a62f19e1baffd42a7a43e9", Delivered: 30000, CPUSeconds: 12},
			{file: "centrifugo-herd-5000x500-r2.json", Commit: "f25c7abd0701195829a62f19e1baffd42a7a43e9", Delivered: 30000, CPUSeconds: 9},
		},
	}
	var b strings.Builder
	renderSitting(&b, s)
	out := b.String()
	for _, want := range []string{
		"| pg-herd-5000x500-5a87271 | polls | 5a87271f3d0a | 3 | 90,000 |", "| 750 µs | 700 µs – 800 µs | 1.07 |",
		"| pg-herd-5000x500 | polls |", "| 700 µs | 600 µs – 800 µs | 1.00 |",
		"| pg-herd-5000x500-stream | streams |", "| 500 µs | 450 µs – 550 µs | 0.71 |",
		"| Centrifugo (centrifugo-herd-5000x500) | uni-directional HTTP streams | f25c7abd0701 | 2 |", "| 350 µs | 300 µs – 400 µs | 0.50 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	renderSitting(&b, sitting{relay: s.relay[:3], peers: s.peers})
	if b.Len() != 0 {
		t.Errorf("a table without this checkout's polls and streams:\n%s", b.String())
	}
}
