package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/flamenet/relay/loadtest/report"
)

// original is a row of the original relay's capacity page (Swift, Postgres
// 17 + Redis 7, an 8-core VPS shared with other workloads, latency
// send-accepted -> poll-returned). Cited, not measured here.
type original struct {
	pairs         int
	rate          float64
	p50, p95, p99 string
	cpu, rss      string
}

var originals = []original{
	{200, 50, "18 ms", "58 ms", "4.0 s", "~idle", "33 MB"},
	{500, 100, "17 ms", "30 ms", "325 ms", "~1.0 core", "44 MB"},
	{1000, 100, "18 ms", "38 ms", "1.0 s", "~1.1 cores", "92 MB"},
	{2000, 150, "22 ms", "1.5 s", "2.6 s", "~1.2 cores", "126 MB"},
}

// render writes the generated section: every table on the page that
// carries a measured figure.
func render(entries []entry, s sitting) []byte {
	var b strings.Builder
	if len(entries) == 0 {
		b.WriteString("No reports in docs/evidence yet. `loadtest/scenarios.sh` runs the scenarios and writes them.\n")
		return []byte(b.String())
	}

	b.WriteString("#### Against the original relay\n\n")
	b.WriteString("p50 / p95 / p99 of send-accepted → poll-returned. The original's figures are cited from its capacity page (8 cores, Postgres 17 + Redis 7); ours come from the runs below, one relay, `-wait 20`, no herd.\n\n")
	table(&b, []string{"Held polls", "Send rate", "Original", "SQLite", "Postgres"}, "rrlll", compareRows(entries))

	b.WriteString("\n#### Runs\n\n")
	b.WriteString("Latency is send-accepted → poll-returned over every delivery, exact percentiles. Relay CPU is the relay processes' CPU time over the measured window (first send to end of drain), as average cores and seconds; RSS is the sum of each relay process's peak; RSS per held poll divides it by the peak of held polls, start-up memory included. A commit marked dirty ran with uncommitted changes, so the commit alone does not describe it.\n\n")
	var rows [][]string
	for _, e := range entries {
		r := e.r
		l := r.LatencyMS.AcceptedToReturned
		rows = append(rows, []string{
			runName(e), r.Store, strconv.Itoa(r.Replicas), count(r.HeldPolls),
			rate(r.OfferedRate, 0), rate(r.AchievedRate, 1), count(r.Accepted), count(r.Delivered),
			count(r.Lost), count(r.Duplicates),
			report.FormatMS(l.P50), report.FormatMS(l.P95), report.FormatMS(l.P99), report.FormatMS(l.P999), report.FormatMS(l.Max),
			relayCPU(r), relayRSS(r), rssPerPoll(r), commit(r.Git),
		})
	}
	table(&b, []string{"Run", "Store", "Relays", "Held polls", "Offered", "Achieved", "Accepted", "Delivered",
		"Lost", "Dup", "p50", "p95", "p99", "p99.9", "Max", "Relay CPU", "Relay RSS", "RSS / held poll", "Commit"},
		"lllrrrrrrrrrrrrrrrl", rows)

	b.WriteString("\n#### How each run went\n\n")
	b.WriteString("Started → returned adds the send's own request time to the figure above. Late sends started more than their threshold after their scheduled time (they were sent anyway, so the offered load held only if this is near zero). Refused sends (429/503) are admission, not losses. The tester's CPU is its own, on the same machine.\n\n")
	rows = rows[:0]
	for _, e := range entries {
		r := e.r
		rows = append(rows, []string{
			runName(e), herd(r), r.Config.Codec, strconv.Itoa(r.Config.PayloadBytes) + " B",
			strconv.Itoa(r.Config.WaitSeconds) + " s", seconds(r.Config.DurationSeconds), seconds(r.WindowSeconds),
			count(r.LateSends), byKind(r.Refused), byKind(r.Errors),
			report.FormatMS(r.LatencyMS.StartedToReturned.P99),
			report.FormatMS(r.LatencyMS.SendRequest.P50) + " / " + report.FormatMS(r.LatencyMS.SendRequest.P99),
			fmt.Sprintf("%.1f s", r.LoadTester.CPUSeconds), r.Date.Format("2006-01-02"),
		})
	}
	table(&b, []string{"Run", "Herd", "Codec", "Payload", "Wait", "Offered for", "Window", "Late sends",
		"Refused", "Errors", "Started → returned p99", "Send request p50 / p99", "Tester CPU", "Date"},
		"llllrrrrllrrrl", rows)

	renderSitting(&b, s)
	renderFanout(&b, s.fanout)
	renderNew(&b, entries)
	renderFailover(&b, entries)

	b.WriteString("\n#### Where they ran\n\n")
	rows = append(rows[:0], machines(entries)...)
	table(&b, []string{"CPU", "Cores", "OS", "Go", "Open files (tester / relay)", "Runs"}, "lrllll", rows)
	return []byte(b.String())
}

// compareRows puts each original row beside the latest matching run per
// store.
func compareRows(entries []entry) [][]string {
	var rows [][]string
	for _, o := range originals {
		row := []string{count(o.pairs), rate(o.rate, 0), o.p50 + " / " + o.p95 + " / " + o.p99}
		for _, store := range []string{"sqlite", "postgres"} {
			var match *entry
			for i, e := range entries {
				c := e.r.Config
				if e.r.Store == store && e.r.Replicas == 1 && !c.Herd && c.WaitSeconds == 20 && c.Plain() &&
					c.Pairs == o.pairs && c.Rate == o.rate && (match == nil || e.r.Date.After(match.r.Date)) {
					match = &entries[i]
				}
			}
			if match == nil {
				row = append(row, "not run")
				continue
			}
			l := match.r.LatencyMS.AcceptedToReturned
			cell := report.FormatMS(l.P50) + " / " + report.FormatMS(l.P95) + " / " + report.FormatMS(l.P99)
			if !match.r.OK {
				cell += " (FAIL)"
			}
			row = append(row, cell)
		}
		rows = append(rows, row)
	}
	return rows
}

func machines(entries []entry) [][]string {
	type key struct{ cpu, cores, os, goVersion, files string }
	var order []key
	runs := map[key][]string{}
	for _, e := range entries {
		m := e.r.Machine
		relay := "n/a"
		if m.RelayOpenFile > 0 {
			relay = count(int(m.RelayOpenFile))
		}
		k := key{m.CPUModel, strconv.Itoa(m.CPUs), m.OS, e.r.Go, count(int(m.OpenFileSoft)) + " / " + relay}
		if _, ok := runs[k]; !ok {
			order = append(order, k)
		}
		runs[k] = append(runs[k], runName(e))
	}
	var rows [][]string
	for _, k := range order {
		rows = append(rows, []string{k.cpu, k.cores, k.os, k.goVersion, k.files, strings.Join(runs[k], ", ")})
	}
	return rows
}

func runName(e entry) string {
	name := e.r.Name
	if name == "" {
		name = strings.TrimSuffix(e.file, ".json")
	}
	if !e.r.OK {
		name += " (FAIL)"
	}
	return name
}

func commit(g report.Git) string {
	c := g.Commit
	if len(c) > 12 {
		c = c[:12]
	}
	if g.Dirty {
		c += " (dirty)"
	}
	return c
}

func relayCPU(r *report.Report) string {
	if r.Relay.Source == "" {
		return "n/a"
	}
	return fmt.Sprintf("%.2f cores (%.1f s)", report.Cores(r), r.Relay.CPUSeconds)
}

func relayRSS(r *report.Report) string {
	if r.Relay.Source == "" {
		return "n/a"
	}
	return report.FormatBytes(r.Relay.PeakRSSBytes)
}

// rssPerPoll is the relay's peak RSS over its peak held polls, start-up
// memory included, so it overstates the cost of one more poll.
func rssPerPoll(r *report.Report) string {
	if r.Relay.Source == "" || r.HeldPolls == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f KiB", float64(r.Relay.PeakRSSBytes)/1024/float64(r.HeldPolls))
}

// count prints an integer with thousands separators, as the prose does.
func count(n int) string {
	s := strconv.Itoa(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func rate(v float64, decimals int) string {
	if decimals == 0 && v == math.Trunc(v) {
		return count(int(v)) + "/s"
	}
	return strconv.FormatFloat(v, 'f', max(decimals, 1), 64) + "/s"
}

func seconds(v float64) string {
	return strconv.FormatFloat(v, 'f', 1, 64) + " s"
}

// herd says whether a run was a herd and, when its report says, how long
// the population took to hold before the sends began.
func herd(r *report.Report) string {
	if r.Config.Herd && r.HerdHeldMS > 0 {
		return "yes, held in " + report.FormatMS(r.HerdHeldMS)
	}
	return yesNo(r.Config.Herd)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// byKind prints a by-kind count, "0" when empty.
func byKind(m map[string]int) string {
	if report.Total(m) == 0 {
		return "0"
	}
	keys := make([]string, 0, len(m))
	for k, n := range m {
		if n > 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %d", k, m[k])
	}
	return strings.Join(parts, "; ")
}

// table writes a Markdown table; align has one 'l' or 'r' per column.
func table(b *strings.Builder, head []string, align string, rows [][]string) {
	b.WriteString("| " + strings.Join(head, " | ") + " |\n|")
	for i := range head {
		if i < len(align) && align[i] == 'r' {
			b.WriteString(" ---: |")
		} else {
			b.WriteString(" --- |")
		}
	}
	b.WriteString("\n")
	for _, row := range rows {
		cells := make([]string, len(row))
		for i, c := range row {
			cells[i] = strings.ReplaceAll(c, "|", `\|`)
		}
		b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
}
