package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/flamenet/relay/loadtest/report"
)

// sitting is what loadtest/stream-sitting.sh leaves in docs/evidence/sitting
// beside this checkout's herd runs: the earlier relay's poll run and
// Centrifugo's run, taken one after another on one machine.
type sitting struct {
	before []entry // the relay of an earlier commit, polls
	peers  []peer  // Centrifugo (loadtest/centrifugo)
	// fanout is loadtest/fanout-sitting.sh's, in docs/evidence/fanout.
	fanout []fanoutRun
}

// peer is a run of loadtest/centrifugo, as far as the page uses it.
type peer struct {
	file string
	Date time.Time `json:"date"`
	// Version and Commit are Centrifugo's.
	Version      string  `json:"centrifugo_version"`
	Commit       string  `json:"centrifugo_commit"`
	Subscribers  int     `json:"subscribers"`
	AchievedRate float64 `json:"achieved_rate"`
	Delivered    int     `json:"delivered"`
	Lost         int     `json:"lost"`
	Duplicates   int     `json:"duplicates"`
	P99MS        float64 `json:"latency_p99_ms"` // publish started to received
	CPUSeconds   float64 `json:"cpu_seconds"`
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
}

// loadSitting reads dir: centrifugo-*.json as peers, every other *.json as
// a relay report. A missing dir is an empty sitting.
func loadSitting(dir string) (sitting, error) {
	var s sitting
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return s, err
	}
	for _, p := range paths {
		name := filepath.Base(p)
		if !strings.HasPrefix(name, "centrifugo-") {
			r, err := report.Read(p)
			if err != nil {
				return s, err
			}
			s.before = append(s.before, entry{file: name, r: r})
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return s, err
		}
		pr := peer{file: name}
		if err := json.Unmarshal(b, &pr); err != nil {
			return s, fmt.Errorf("%s: %w", p, err)
		}
		s.peers = append(s.peers, pr)
	}
	return s, nil
}

// The herd runs of this checkout that the sitting sets side by side.
const (
	sittingPolls   = "pg-herd-5000x500"
	sittingStreams = "pg-herd-5000x500-stream"
)

// renderSitting writes the streams-beside-polls table: CPU per delivered
// message of each run of the sitting, and its ratio to this checkout's
// polls.
func renderSitting(b *strings.Builder, entries []entry, s sitting) {
	var polls, streams *report.Report
	for _, e := range entries {
		switch e.r.Name {
		case sittingPolls:
			polls = e.r
		case sittingStreams:
			streams = e.r
		}
	}
	if polls == nil || streams == nil || (len(s.before) == 0 && len(s.peers) == 0) {
		return
	}
	base := perMessage(polls.Relay.CPUSeconds, polls.Delivered)
	b.WriteString("\n#### Streams beside polls, in one sitting\n\n")
	b.WriteString("`loadtest/stream-sitting.sh`: 5,000 recipients in step, 500 sends a second for 60 s, one after another on one machine. CPU is the server process's over the measured window, per delivered message; the ratio is to this relay's polls in the same sitting. Latency p99 is send started → received (Centrifugo: publish started → received). Centrifugo is built from its public source; it neither commits nor acknowledges, so it is the direction, not the bar.\n\n")
	var rows [][]string
	relayRow := func(name, transport string, r *report.Report) {
		cpu := perMessage(r.Relay.CPUSeconds, r.Delivered)
		built := r.Git // the tester's tree, which built the relay
		if r.Relay.Git != nil {
			built = *r.Relay.Git
		}
		rows = append(rows, []string{name, transport, commit(built), count(r.Delivered), count(r.Lost), count(r.Duplicates),
			fmt.Sprintf("%.1f s", r.Relay.CPUSeconds), micros(cpu), ratio(cpu, base),
			report.FormatMS(r.LatencyMS.StartedToReturned.P99), report.FormatBytes(r.Relay.PeakRSSBytes), r.Date.UTC().Format("2006-01-02 15:04")})
	}
	for _, e := range s.before {
		relayRow(runName(e), "polls", e.r)
	}
	relayRow(sittingPolls, "polls", polls)
	relayRow(sittingStreams, "streams", streams)
	for _, p := range s.peers {
		cpu := perMessage(p.CPUSeconds, p.Delivered)
		c := p.Commit
		if len(c) > 12 {
			c = c[:12]
		}
		rows = append(rows, []string{"Centrifugo (" + strings.TrimSuffix(p.file, ".json") + ")", "uni-directional HTTP streams", c,
			count(p.Delivered), count(p.Lost), count(p.Duplicates), fmt.Sprintf("%.1f s", p.CPUSeconds), micros(cpu), ratio(cpu, base),
			fmt.Sprintf("%.1f ms", p.P99MS), report.FormatBytes(p.PeakRSSBytes), p.Date.UTC().Format("2006-01-02 15:04")})
	}
	table(b, []string{"Run", "Receivers hold", "Server's commit", "Delivered", "Lost", "Dup", "CPU", "CPU per message", "× polls", "p99", "Peak RSS", "Started"},
		"lllrrrrrrrrl", rows)
}

// perMessage is seconds per delivered message, in microseconds.
func perMessage(cpuSeconds float64, delivered int) float64 {
	if delivered == 0 {
		return 0
	}
	return cpuSeconds / float64(delivered) * 1e6
}

func micros(us float64) string { return fmt.Sprintf("%.0f µs", us) }

func ratio(v, base float64) string {
	if base == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", v/base)
}

// sittingDir is where loadSitting looks, below the evidence directory.
func sittingDir(evidence string) string { return filepath.Join(evidence, "sitting") }
