package main

import (
	"strings"
	"testing"

	"github.com/flamenet/relay/loadtest/report"
)

// TestRenderSitting: each run of the sitting gets its CPU per delivered
// message and its ratio to this checkout's polls; without the sitting's
// own runs there is no table.
func TestRenderSitting(t *testing.T) {
	run := func(name string, cpu float64) entry {
		return entry{file: name + ".json", r: &report.Report{Name: name, OK: true, Delivered: 30000, Relay: report.Relay{Source: "proc", CPUSeconds: cpu}}}
	}
	entries := []entry{run(sittingPolls, 21), run(sittingStreams, 15)}
	before := run("pg-herd-5000x500-5a87271", 22.5)
	before.r.Git = report.Git{Commit: "5ccd675f0157b3916f492e580bb0032ef6582a99"}
	before.r.Relay.Git = &report.Git{Commit: "5a87271f3d0a"}
	s := sitting{
		before: []entry{before},
		peers:  []peer{{file: "centrifugo-herd-5000x500.json", Commit: "f25c7abd0701195829a62f19e1baffd42a7a43e9", Delivered: 30000, CPUSeconds: 12}},
	}
	var b strings.Builder
	renderSitting(&b, entries, s)
	out := b.String()
	for _, want := range []string{
		"| pg-herd-5000x500-5a87271 | polls | 5a87271f3d0a |", "| 750 µs | 1.07 |",
		"| pg-herd-5000x500 | polls |", "| 700 µs | 1.00 |",
		"| pg-herd-5000x500-stream | streams |", "| 500 µs | 0.71 |",
		"| Centrifugo (centrifugo-herd-5000x500) | uni-directional HTTP streams | f25c7abd0701 |", "| 400 µs | 0.57 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	renderSitting(&b, entries, sitting{})
	if b.Len() != 0 {
		t.Errorf("a table without the sitting's runs:\n%s", b.String())
	}
}
