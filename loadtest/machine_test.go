package main

import (
	"os"
	"strings"
	"testing"
)

func TestProcReadings(t *testing.T) {
	pid := os.Getpid()
	if _, err := procCPU(pid); err != nil {
		t.Errorf("procCPU: %v", err)
	}
	if b, err := procStatusBytes(pid, "VmHWM"); err != nil || b <= 0 {
		t.Errorf("VmHWM = %d, %v", b, err)
	}
	if l, err := procOpenFileLimit(pid); err != nil || l == 0 {
		t.Errorf("open-file limit = %d, %v", l, err)
	}
	if m := machine(); m.CPUs < 1 || m.OpenFileSoft == 0 {
		t.Errorf("machine = %+v", m)
	}
}

func TestParseProcessMetrics(t *testing.T) {
	text := `# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
process_resident_memory_bytes 4.4e+07
fn_held_polls 3
`
	cpu, rss, err := parseProcessMetrics(strings.NewReader(text))
	if err != nil || cpu != 12.5 || rss != 44_000_000 {
		t.Errorf("got %v, %v, %v", cpu, rss, err)
	}
	if _, _, err := parseProcessMetrics(strings.NewReader("fn_held_polls 3\n")); err == nil {
		t.Error("metrics without process figures accepted")
	}
}
