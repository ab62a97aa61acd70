package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flamenet/relay/loadtest/report"
)

// sitting is what loadtest/stream-sitting.sh leaves in docs/evidence/sitting:
// rounds of the earlier relay's polls, this checkout's polls and streams,
// and Centrifugo's streams, taken one after another on one machine.
type sitting struct {
	relay []entry // the relay's runs, every round's
	peers []peer  // Centrifugo (loadtest/centrifugo)
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
			s.relay = append(s.relay, entry{file: name, r: r})
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

// The sitting's runs of this checkout, by name less the round's suffix.
const (
	sittingPolls   = "pg-herd-5000x500"
	sittingStreams = "pg-herd-5000x500-stream"
)

// roundSuffix is how a run's name ends with its round (-r2).
var roundSuffix = regexp.MustCompile(`-r[0-9]+$`)

// sittingRow is one kind of run of the sitting, every round of it.
type sittingRow struct {
	name, transport, commit string
	cpu, p99                []float64 // per round: µs per delivered message; ms
	delivered, lost, dup    int       // over the rounds
	rss                     int64     // the largest
	started                 time.Time // the first round's
}

func (r *sittingRow) add(cpu, p99 float64, delivered, lost, dup int, rss int64, started time.Time) {
	r.cpu, r.p99 = append(r.cpu, cpu), append(r.p99, p99)
	r.delivered += delivered
	r.lost += lost
	r.dup += dup
	r.rss = max(r.rss, rss)
	if r.started.IsZero() || started.Before(r.started) {
		r.started = started
	}
}

// renderSitting writes the streams-beside-polls table: for each kind of
// run, the median over its rounds of CPU per delivered message and of
// p99, and the ratio of that median to this checkout's polls'.
func renderSitting(b *strings.Builder, s sitting) {
	var rows []*sittingRow
	byName := map[string]*sittingRow{}
	row := func(name, transport, commit string) *sittingRow {
		if r := byName[name]; r != nil {
			return r
		}
		r := &sittingRow{name: name, transport: transport, commit: commit}
		byName[name] = r
		rows = append(rows, r)
		return r
	}
	for _, e := range s.relay {
		r := e.r
		name := roundSuffix.ReplaceAllString(runName(e), "")
		transport := "polls"
		if r.Config.Transport == "stream" {
			transport = "streams"
		}
		built := r.Git // the tester's tree, which built the relay
		if r.Relay.Git != nil {
			built = *r.Relay.Git
		}
		row(name, transport, commit(built)).add(perMessage(r.Relay.CPUSeconds, r.Delivered), r.LatencyMS.StartedToReturned.P99,
			r.Delivered, r.Lost, r.Duplicates, r.Relay.PeakRSSBytes, r.Date)
	}
	for _, p := range s.peers {
		c := p.Commit
		if len(c) > 12 {
			c = c[:12]
		}
		name := "Centrifugo (" + roundSuffix.ReplaceAllString(strings.TrimSuffix(p.file, ".json"), "") + ")"
		row(name, "uni-directional HTTP streams", c).add(perMessage(p.CPUSeconds, p.Delivered), p.P99MS,
			p.Delivered, p.Lost, p.Duplicates, p.PeakRSSBytes, p.Date)
	}
	polls, streams := byName[sittingPolls], byName[sittingStreams]
	if polls == nil || streams == nil {
		return
	}
	base := median(polls.cpu)
	b.WriteString("\n#### Streams beside polls, in one sitting\n\n")
	b.WriteString("`loadtest/stream-sitting.sh`: 5,000 recipients in step, 500 sends a second for 60 s, each kind of run once a round, one after another on one machine, each round starting one further along. CPU is the server process's over the measured window, per delivered message: the median of the rounds, and their range; the ratio is of that median to this relay's polls'. Latency p99 is send started → received (Centrifugo: publish started → received), the median of the rounds'. Delivered, lost and dup are over all rounds. Centrifugo is built from its public source; it neither commits nor acknowledges, so it is the direction, not the bar.\n\n")
	var cells [][]string
	for _, r := range rows {
		cells = append(cells, []string{r.name, r.transport, r.commit, strconv.Itoa(len(r.cpu)),
			count(r.delivered), count(r.lost), count(r.dup),
			micros(median(r.cpu)), micros(slices.Min(r.cpu)) + " – " + micros(slices.Max(r.cpu)), ratio(median(r.cpu), base),
			fmt.Sprintf("%.1f ms", median(r.p99)), report.FormatBytes(r.rss), r.started.UTC().Format("2006-01-02 15:04")})
	}
	table(b, []string{"Run", "Receivers hold", "Server's commit", "Rounds", "Delivered", "Lost", "Dup", "CPU per message", "Range", "× polls", "p99", "Peak RSS", "Started"},
		"llllrrrrlrrrl", cells)
}

// median is the middle of xs (the mean of the two middle ones for an even
// count); xs is not changed.
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
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
