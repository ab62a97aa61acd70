package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/flamenet/relay/loadtest/report"
)

// fanoutRun is one run of loadtest/fanout-sitting.sh: 4 relays of one
// commit on one Redis setup, loaded by two testers side by side (a and b),
// and what Redis did meanwhile.
type fanoutRun struct {
	setup, side string // single or cluster; before or after
	a, b        *report.Report
	redis       redisFigures
	steady      *redisFigures // the sends alone, when the sitting read it
}

// redisFigures is the script's redis-<setup>-<side>.json, as far as the
// page uses it.
type redisFigures struct {
	RelayCommit string `json:"relay_commit"`
	RelayDirty  bool   `json:"relay_dirty"`
	Date        string `json:"date"`
	Sum         struct {
		CPUSeconds  float64          `json:"cpu_seconds"`
		NetIn       int64            `json:"net_in_bytes"`
		NetOut      int64            `json:"net_out_bytes"`
		Commands    int64            `json:"commands"`
		PubsubCalls map[string]int64 `json:"pubsub_calls"`
		Peaks       map[string]int64 `json:"pubsub_gauge_peaks"`
	} `json:"sum"`
	Nodes         []json.RawMessage `json:"nodes"`
	WindowSeconds float64           `json:"window_seconds"` // the sends alone's
}

func readFigures(path string) (redisFigures, error) {
	var f redisFigures
	b, err := os.ReadFile(path)
	if err != nil {
		return f, err
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// fanoutDir is where loadFanout looks, below the evidence directory.
func fanoutDir(evidence string) string { return filepath.Join(evidence, "fanout") }

// loadFanout reads dir's runs: each redis-<setup>-<side>.json with its two
// testers' reports. A missing dir has none.
func loadFanout(dir string) ([]fanoutRun, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "redis-*.json"))
	if err != nil {
		return nil, err
	}
	var runs []fanoutRun
	for _, p := range paths {
		base := filepath.Base(p)
		if strings.HasPrefix(base, "redis-steady-") {
			continue // read with its run
		}
		setup, side, ok := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(base, "redis-"), ".json"), "-")
		if !ok {
			return nil, fmt.Errorf("%s: want redis-<setup>-<side>.json", p)
		}
		run := fanoutRun{setup: setup, side: side}
		if run.redis, err = readFigures(p); err != nil {
			return nil, err
		}
		steady := filepath.Join(dir, "redis-steady-"+setup+"-"+side+".json")
		if _, err := os.Stat(steady); err == nil {
			f, err := readFigures(steady)
			if err != nil {
				return nil, err
			}
			run.steady = &f
		}
		for _, half := range []struct {
			name string
			r    **report.Report
		}{{"a", &run.a}, {"b", &run.b}} {
			if *half.r, err = report.Read(filepath.Join(dir, "fanout-"+setup+"-"+side+"-"+half.name+".json")); err != nil {
				return nil, err
			}
		}
		runs = append(runs, run)
	}
	// Single before cluster, before before after.
	sort.Slice(runs, func(i, j int) bool {
		if runs[i].setup != runs[j].setup {
			return runs[i].setup > runs[j].setup
		}
		return runs[i].side == "before" && runs[j].side != "before"
	})
	return runs, nil
}

// renderFanout writes the tables of the fan-out sitting: what each relay
// heard of the fleet's wake-ups, and what Redis did for them.
func renderFanout(b *strings.Builder, runs []fanoutRun) {
	if len(runs) == 0 {
		return
	}
	b.WriteString("\n#### Wake-ups per relay, in one sitting\n\n")
	b.WriteString("`loadtest/fanout-sitting.sh`: 4 relays on Postgres holding the devices below spread evenly, each send on another relay than its recipient's poll, the relay of an earlier commit (every relay hears every wake-up) and of this one (a relay hears the devices it holds), on one Redis server and on a Redis Cluster of 3 masters, one after another on one machine. Two load testers run side by side (one cannot hold 20,000 connections here); a relay's wake-ups are read over tester a's window and cover both testers' sends. Share is a relay's wake-ups received over all sends accepted: each relay's share of the devices is 25 %, and a send on another relay than the recipient's reaches it once. Not held: of the wake-ups received, those for devices the relay did not hold.\n\n")
	var rows [][]string
	for _, r := range runs {
		sends := r.a.Accepted + r.b.Accepted
		lo, hi, recv, unheld, subs := wakeSpread(r.a.Wakes)
		rows = append(rows, []string{r.setup, r.side, fanoutCommit(r), count(r.a.HeldPolls + r.b.HeldPolls), count(sends),
			count(int(lo)) + " – " + count(int(hi)), percent(hi, float64(sends)), percent(unheld, recv), subs,
			count(r.a.Lost + r.b.Lost), count(r.a.Duplicates + r.b.Duplicates)})
	}
	table(b, []string{"Redis", "Relay", "Commit", "Held", "Sends", "Received per relay", "Share (most)", "Not held", "Device subscriptions per relay", "Lost", "Dup"},
		"lllrrrrrrrr", rows)

	b.WriteString("\n#### What Redis did for them\n\n")
	b.WriteString("Every node's INFO, after minus before, summed over the nodes, over two windows: all of the two testers' run (the population's arrival, the sends and their drain; the relays' start-up is outside), and the sends alone (from both testers sending until 10 s before the sends end). CPU is used_cpu_sys + used_cpu_user, network and commands as INFO stats counts them; the pub/sub commands from INFO commandstats; channels is the peak of the subscribed channels (shard channels on a Cluster) sampled every few seconds.\n\n")
	rows = rows[:0]
	for _, r := range runs {
		rows = append(rows, redisRow(r, "all", r.redis))
		if r.steady != nil {
			rows = append(rows, redisRow(r, fmt.Sprintf("sends alone (%.0f s)", r.steady.WindowSeconds), *r.steady))
		}
	}
	table(b, []string{"Redis", "Relay", "Window", "CPU", "Net in", "Net out", "Commands", "Publishes", "Subscribes", "Unsubscribes", "Channels", "Date"},
		"lllrrrrrrrrl", rows)
}

// redisRow is one row of what Redis did, over the window named.
func redisRow(r fanoutRun, window string, f redisFigures) []string {
	s := f.Sum
	channels := "–"
	if s.Peaks != nil && window == "all" {
		channels = count(int(s.Peaks["pubsub_channels"] + s.Peaks["pubsubshard_channels"]))
	}
	return []string{r.setup, r.side, window,
		fmt.Sprintf("%.2f s", s.CPUSeconds), report.FormatBytes(s.NetIn), report.FormatBytes(s.NetOut), count(int(s.Commands)),
		count(int(s.PubsubCalls["publish"] + s.PubsubCalls["spublish"])),
		count(int(s.PubsubCalls["subscribe"] + s.PubsubCalls["ssubscribe"])),
		count(int(s.PubsubCalls["unsubscribe"] + s.PubsubCalls["sunsubscribe"])),
		channels, f.Date}
}

// wakeSpread is the least and most wake-ups a relay received, the sums of
// received and of not held, and the device subscriptions per relay at the
// end (a range, or "" when the relays do not say).
func wakeSpread(ws []report.RelayWakes) (lo, hi, recv, unheld float64, subs string) {
	first := true
	var slo, shi float64
	haveSubs := false
	for _, w := range ws {
		if w.Received != nil {
			if first || *w.Received < lo {
				lo = *w.Received
			}
			if first || *w.Received > hi {
				hi = *w.Received
			}
			first = false
			recv += *w.Received
		}
		if w.Unheld != nil {
			unheld += *w.Unheld
		}
		if w.SubscriptionsEnd != nil {
			v := *w.SubscriptionsEnd
			if !haveSubs || v < slo {
				slo = v
			}
			if !haveSubs || v > shi {
				shi = v
			}
			haveSubs = true
		}
	}
	subs = "none (shard channels)"
	if haveSubs {
		subs = count(int(slo)) + " – " + count(int(shi))
	}
	return lo, hi, recv, unheld, subs
}

func fanoutCommit(r fanoutRun) string {
	c := r.redis.RelayCommit
	if len(c) > 7 {
		c = c[:7]
	}
	if r.redis.RelayDirty {
		c += " (dirty)"
	}
	return c
}

func percent(v, of float64) string {
	if of == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f %%", 100*v/of)
}
