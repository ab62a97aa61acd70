package check

import (
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/loadtest/report"
)

// TestRedeliveryNote: a run with explicit acks and crashes that saw no
// redelivery says why; with cursor acks, or with redeliveries, it says
// nothing.
func TestRedeliveryNote(t *testing.T) {
	fill := func(ack string, crashes []report.Crash) string {
		res := &Result{ExplicitAck: ack == "explicit", Duration: time.Second, Crashes: crashes,
			Refused: map[string]int{}, Errors: map[string]int{}}
		rep := &report.Report{}
		res.Fill(rep)
		return rep.RedeliveryNote
	}
	if n := fill("explicit", []report.Crash{{AtSeconds: 2, AcksAtRisk: 0}}); n == "" || !strings.Contains(n, "no acknowledgement") {
		t.Errorf("no acks at risk: note %q", n)
	}
	if n := fill("explicit", []report.Crash{{AtSeconds: 2, AcksAtRisk: 3}, {AtSeconds: 4, AcksAtRisk: 1}}); !strings.Contains(n, "4 acknowledgements") || !strings.Contains(n, "2.0 s, 4.0 s") {
		t.Errorf("acks at risk: note %q", n)
	}
	if n := fill("cursor", []report.Crash{{AtSeconds: 2}}); n != "" {
		t.Errorf("cursor acks: note %q", n)
	}
	if n := fill("explicit", nil); n != "" {
		t.Errorf("no crash: note %q", n)
	}
}
