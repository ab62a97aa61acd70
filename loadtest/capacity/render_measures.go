package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/flamenet/relay/loadtest/report"
)

// renderNew writes the tables of what newer reports measure: memory per
// held poll, crashes, hostile requests, memory caps, Redis connections,
// changed relay settings. Each appears only when some report has what it
// shows, so the page of older evidence stays as it was.
func renderNew(b *strings.Builder, entries []entry) {
	if rows := slopeRows(entries); len(rows) > 0 {
		b.WriteString("\n#### Memory per held poll\n\n")
		b.WriteString("Relay RSS in the second half of each run's offered window (the median of one sample a second, summed over relays), for runs that differ only in how many recipients hold polls (or streams). The slope, (RSS of the larger population − RSS of the smaller) / (difference in held polls), is what one more held poll costs; start-up memory cancels out of it, unlike in the RSS / held poll column above.\n\n")
		table(b, []string{"Store", "Relays", "Send rate", "Receivers hold", "Runs", "Held", "Relay RSS", "Per extra held poll or stream"}, "lrrllrrr", rows)
	}

	var crashRows [][]string
	for _, e := range entries {
		r := e.r
		if len(r.Crashes) == 0 {
			continue
		}
		var crashes []string
		for _, c := range r.Crashes {
			cell := fmt.Sprintf("%.1f s, %s, back in %s", c.AtSeconds, relays(c.Replicas, r.Replicas), report.FormatMS(c.DownMS))
			if c.Error != "" {
				cell = fmt.Sprintf("%.1f s, %s, did not come back", c.AtSeconds, relays(c.Replicas, r.Replicas))
			}
			crashes = append(crashes, cell)
		}
		ack := r.Config.AckMode
		if ack == "" {
			ack = "cursor"
		}
		redelivered := count(r.Redelivered)
		if r.RedeliveryNote != "" {
			redelivered += " (" + r.RedeliveryNote + ")"
		}
		crashRows = append(crashRows, []string{
			runName(e), r.Store, strconv.Itoa(r.Replicas), ack, strings.Join(crashes, "; "),
			count(r.Accepted), count(r.Delivered), count(r.Lost), count(r.Duplicates), redelivered, byKind(r.Retried),
		})
	}
	if len(crashRows) > 0 {
		b.WriteString("\n#### Crashes\n\n")
		b.WriteString("Each crash is a SIGKILL of the relay (every replica, or the one named) and a restart on the same data and port; \"back in\" runs from the kill to the first 200 from `/ready`. Senders retry a send that got no answer with the same id. Redelivered envelopes came again, with the same seq, after a crash lost their acknowledgement (explicit acks only); they are not duplicates. Retried requests failed while their relay was down.\n\n")
		table(b, []string{"Run", "Store", "Relays", "Acks", "Crashes", "Accepted", "Delivered", "Lost", "Dup", "Redelivered", "Retried"},
			"lllllrrrrll", crashRows)
	}

	var hostileRuns, hostileRows [][]string
	for _, e := range entries {
		h := e.r.Hostile
		if h == nil {
			continue
		}
		hostileRuns = append(hostileRuns, []string{runName(e), count(h.Connections), count(h.Requests),
			seconds(h.CloseLimitSeconds), byKind(h.Failures)})
		kinds := make([]string, 0, len(h.Outcomes))
		for k := range h.Outcomes {
			kinds = append(kinds, k)
		}
		slices.Sort(kinds)
		for _, k := range kinds {
			hostileRows = append(hostileRows, []string{runName(e), k, count(report.Total(h.Outcomes[k])), byKind(h.Outcomes[k])})
		}
	}
	if len(hostileRuns) > 0 {
		b.WriteString("\n#### Hostile requests\n\n")
		b.WriteString("Connections that flooded the relay beside the load, each with a household of its own. A run fails on a 5xx other than 503, a hostile request accepted, or a connection the relay did not close within the close limit (its body timeout plus 10 s). \"+closed\" means the relay closed the connection after its answer.\n\n")
		table(b, []string{"Run", "Connections", "Requests", "Close limit", "Failures"}, "lrrrl", hostileRuns)
		b.WriteString("\n")
		table(b, []string{"Run", "Kind", "Requests", "Outcomes"}, "llrl", hostileRows)
	}

	var slowRows [][]string
	for _, e := range entries {
		h := e.r.Hostile
		if h == nil || h.SlowReaders == 0 {
			continue
		}
		slowRows = append(slowRows, []string{runName(e), count(h.SlowReaders), count(h.SlowReaderRounds), seconds(h.SlowReaderLimitSeconds),
			report.FormatBytes(h.TCPMemoryStartBytes) + " → " + report.FormatBytes(h.TCPMemoryPeakBytes)})
	}
	if len(slowRows) > 0 {
		b.WriteString("\n#### Slow readers\n\n")
		b.WriteString("One device token of the hostile runs sends itself 2 MiB, then opens a round of connections with a 4 KiB receive buffer, each polling `cursor=0&wait=0`, and reads nothing until the limit (the relay's `FN_ANSWER_TIMEOUT` plus the answer's size at `FN_ANSWER_MIN_RATE`, plus 10 s); rounds follow until the offered duration is over. Each answer must by then have been refused or cut: one left open, or handed whole to the kernel while nobody read it, fails the run. Their outcomes are the slow reader rows above. Kernel TCP memory is the machine's, every socket's (the tester's too), as the slow readers began and at its peak while they ran.\n\n")
		table(b, []string{"Run", "A round", "Rounds", "Limit", "Kernel TCP memory"}, "lrrrl", slowRows)
	}

	var memRows [][]string
	for _, e := range entries {
		m := e.r.Memory
		if m == nil {
			continue
		}
		cgPeak := "n/a"
		if m.CgroupPeakBytes > 0 {
			cgPeak = report.FormatBytes(m.CgroupPeakBytes)
		}
		enforced := m.Enforced
		if m.Warning != "" {
			enforced += " (" + m.Warning + ")"
		}
		memRows = append(memRows, []string{runName(e), mib(m.LimitBytes), enforced, mib(m.AppliedBytes),
			report.FormatBytes(m.PeakRSSBytes), cgPeak, yesNo(m.OOMKilled)})
	}
	if len(memRows) > 0 {
		b.WriteString("\n#### Memory limit\n\n")
		b.WriteString("Each relay ran with GOMEMLIMIT at the limit and inside a limit the kernel enforces; \"applied\" is that limit read back from the kernel. Peak RSS is the highest of any relay process; the cgroup's peak counts page cache too. An OOM kill fails the run.\n\n")
		table(b, []string{"Run", "Limit", "Enforced by", "Applied", "Peak RSS", "Cgroup peak", "OOM-killed"}, "lrlrrrl", memRows)
	}

	var redisRows [][]string
	for _, e := range entries {
		rd := e.r.Redis
		if rd == nil {
			continue
		}
		redisRows = append(redisRows, []string{runName(e), strconv.Itoa(e.r.Replicas),
			count(rd.ClientsBefore), count(rd.ClientsMedian), count(rd.ClientsPeak), count(rd.Samples)})
	}
	if len(redisRows) > 0 {
		b.WriteString("\n#### Redis connections\n\n")
		b.WriteString("Redis's `connected_clients` (INFO clients), once a second while the relays ran; \"before\" is the server's other clients, sampled before the relays started.\n\n")
		table(b, []string{"Run", "Relays", "Before", "Median", "Peak", "Samples"}, "lrrrrr", redisRows)
	}

	var envRows [][]string
	for _, e := range entries {
		if len(e.r.Config.RelayEnv) > 0 {
			envRows = append(envRows, []string{runName(e), "`" + strings.Join(e.r.Config.RelayEnv, "` `") + "`"})
		}
	}
	if len(envRows) > 0 {
		b.WriteString("\n#### Relay settings changed\n\n")
		table(b, []string{"Run", "Settings"}, "ll", envRows)
	}
}

// slopeRows pairs runs that differ only in their population: same store,
// relays, send rate, wait, payload, codec, herd and transport (polls or
// streams), plain, with a steady state measured. For each such group with two populations or more, the
// smallest and the largest give the slope.
func slopeRows(entries []entry) [][]string {
	type key struct {
		store          string
		replicas, wait int
		payload        int
		rate           float64
		codec          string
		herd           bool
		transport      string
	}
	var order []key
	groups := map[key][]entry{}
	for _, e := range entries {
		r := e.r
		c := r.Config
		if r.Steady == nil || r.Steady.HeldPolls <= 0 || !c.Plain() {
			continue
		}
		k := key{r.Store, r.Replicas, c.WaitSeconds, c.PayloadBytes, c.Rate, c.Codec, c.Herd, c.Transport}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], e)
	}
	var rows [][]string
	for _, k := range order {
		g := groups[k]
		lo, hi := g[0], g[0]
		for _, e := range g[1:] {
			if e.r.Steady.HeldPolls < lo.r.Steady.HeldPolls {
				lo = e
			}
			if e.r.Steady.HeldPolls > hi.r.Steady.HeldPolls {
				hi = e
			}
		}
		dh := hi.r.Steady.HeldPolls - lo.r.Steady.HeldPolls
		if dh <= 0 {
			continue
		}
		slope := float64(hi.r.Steady.RSSBytes-lo.r.Steady.RSSBytes) / float64(dh) / 1024
		held := "polls"
		if k.transport == "stream" {
			held = "streams"
		}
		rows = append(rows, []string{
			k.store, strconv.Itoa(k.replicas), rate(k.rate, 0), held, runName(lo) + ", " + runName(hi),
			count(lo.r.Steady.HeldPolls) + " → " + count(hi.r.Steady.HeldPolls),
			report.FormatBytes(lo.r.Steady.RSSBytes) + " → " + report.FormatBytes(hi.r.Steady.RSSBytes),
			fmt.Sprintf("%.1f KiB", slope),
		})
	}
	return rows
}

// relays names the replicas a crash killed.
func relays(killed []int, replicas int) string {
	if len(killed) == replicas && replicas > 1 {
		return "every relay"
	}
	if replicas == 1 {
		return "the relay"
	}
	parts := make([]string, len(killed))
	for i, k := range killed {
		parts[i] = strconv.Itoa(k)
	}
	return "relay " + strings.Join(parts, ", ")
}

// mib prints a limit in MiB, as it was asked for.
func mib(n int64) string {
	if n <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%s MiB", count(int(n>>20)))
}
