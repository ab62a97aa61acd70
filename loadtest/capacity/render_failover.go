package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/flamenet/relay/loadtest/report"
)

// renderFailover writes the table of the -failover runs: the relays on a
// pg_auto_failover formation whose primary was killed mid-run. Absent when
// no report has one.
func renderFailover(b *strings.Builder, entries []entry) {
	var rows [][]string
	for _, e := range entries {
		r, f := e.r, e.r.Failover
		if f == nil {
			continue
		}
		promoted, first := report.FormatMS(f.PromotedMS), report.FormatMS(f.FirstDeliveryMS)
		if f.PromotedMS == 0 {
			promoted = "not promoted"
		}
		if f.FirstDeliveryMS == 0 {
			first = "none"
		}
		mode := f.Mode
		if f.CutMS > 0 {
			mode += fmt.Sprintf(", replication cut %s before", report.FormatMS(f.CutMS))
		}
		rows = append(rows, []string{
			runName(e), strconv.Itoa(r.Replicas), count(r.Config.Pairs), rate(r.OfferedRate, 0), mode,
			fmt.Sprintf("%.1f s", f.AtSeconds), promoted, first, byKind(f.SendsRefused),
			count(r.Accepted), count(r.Delivered), count(r.Lost), count(r.Duplicates), count(r.Reordered),
		})
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("\n#### Failover\n\n")
	b.WriteString("The relays on a pg_auto_failover formation of the tester's own (a monitor, a primary and a standby, `internal/hapg`), whose primary's machine was lost mid-run: its keeper and its Postgres killed with SIGKILL at \"killed at\", after the first send. \"Promoted\" runs from the kill until the monitor had promoted the standby and it took writes; \"first delivery\" from the kill to the first delivery of a send first tried after it. Refused sends failed while no primary took writes (until two seconds after the promotion): 503s and sends without an answer, which their senders tried again with the same id, and 429s (the relay's sends in flight at their limit while store calls waited), which the tester does not try again.\n\n")
	table(b, []string{"Run", "Relays", "Held polls", "Send rate", "Replication", "Killed at", "Promoted", "First delivery",
		"Sends refused", "Accepted", "Delivered", "Lost", "Dup", "Reordered"}, "lrrrlrrrlrrrrr", rows)
}
