package meter

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/flamenet/relay/internal/fdlimit"
	"github.com/flamenet/relay/internal/procstat"
	"github.com/flamenet/relay/loadtest/report"
)

// EphemeralPorts returns the kernel's range of local ports for outgoing
// connections.
func EphemeralPorts() (lo, hi int, err error) {
	r, err := procstat.SysctlInts("net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, err
	}
	if len(r) != 2 || r[1] < r[0] {
		return 0, 0, fmt.Errorf("ip_local_port_range: %v", r)
	}
	return r[0], r[1], nil
}

// GitState returns a description of the checkout at src.
func GitState(ctx context.Context, src string) report.Git {
	g := report.Git{Commit: "unknown"}
	if src == "" {
		return g
	}
	head := exec.CommandContext(ctx, "git", "rev-parse", "HEAD")
	head.Dir = src
	out, err := head.Output()
	if err != nil {
		return g
	}
	g.Commit = strings.TrimSpace(string(out))
	// The evidence the scenarios write, and the page rendered from it, are
	// this tool's own output: they say nothing about what ran, and counting
	// them would mark every run after the first in a series dirty.
	status := exec.CommandContext(ctx, "git", "status", "--porcelain", "--", ".",
		":(exclude)docs/evidence", ":(exclude)docs/CAPACITY.md")
	status.Dir = src
	out, err = status.Output()
	if err != nil {
		// Unknown counts as dirty: the commit alone may not describe it.
		g.Dirty = true
		return g
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		g.Dirty = true
		g.DirtyPaths = len(strings.Split(s, "\n"))
	}
	return g
}

// Machine returns a description of the machine the run is on.
func Machine() report.Machine {
	m := report.Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if rel, err := procstat.Sysctl("kernel/osrelease"); err == nil {
		m.OS += " " + rel
	}
	m.CPUModel = procstat.CPUModel()
	if soft, hard, err := fdlimit.Current(); err == nil {
		m.OpenFileSoft, m.OpenFileHard = soft, hard
	}
	return m
}

// OpenFileLimit returns the soft "Max open files" of a process.
func OpenFileLimit(pid int) (uint64, error) {
	return procstat.OpenFileLimit(pid)
}

// SelfUsage returns this process's own CPU time and peak RSS.
func SelfUsage() report.Process {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return report.Process{}
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return report.Process{CPUSeconds: round3(cpu.Seconds()), PeakRSSBytes: ru.Maxrss * 1024}
}

// scrapeProcess reads process_cpu_seconds_total and
// process_resident_memory_bytes from a Prometheus text endpoint.
func scrapeProcess(ctx context.Context, hc *http.Client, url string) (cpu float64, rss int64, err error) {
	err = scrape(ctx, hc, url, func(r io.Reader) (err error) {
		cpu, rss, err = parseProcessMetrics(r)
		return err
	})
	return cpu, rss, err
}

// scrape GETs a Prometheus text endpoint and hands its body to parse.
func scrape(ctx context.Context, hc *http.Client, url string, parse func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("scrape %s: status %d", url, resp.StatusCode)
	}
	if err := parse(io.LimitReader(resp.Body, 16<<20)); err != nil {
		return fmt.Errorf("scrape %s: %w", url, err)
	}
	return nil
}

func parseProcessMetrics(r io.Reader) (cpu float64, rss int64, err error) {
	got, err := readSeries(r, "process_cpu_seconds_total", "process_resident_memory_bytes")
	if err != nil {
		return 0, 0, err
	}
	cpu, haveCPU := got["process_cpu_seconds_total"]
	v, haveRSS := got["process_resident_memory_bytes"]
	if !haveCPU || !haveRSS {
		return 0, 0, fmt.Errorf("metrics lack process_cpu_seconds_total or process_resident_memory_bytes")
	}
	return cpu, int64(v), nil
}

// parseGauge reads the value of one series from a Prometheus text
// exposition; one it lacks is an error.
func parseGauge(r io.Reader, name string) (float64, error) {
	got, err := readSeries(r, name)
	if err != nil {
		return 0, err
	}
	v, ok := got[name]
	if !ok {
		return 0, fmt.Errorf("no %s in the metrics", name)
	}
	return v, nil
}

// readSeries returns the values of the series in want that a Prometheus
// text exposition has; those it lacks are absent from the map, not zero,
// since a relay may be older than a series. A series is named by its
// metric and labels, as in fn_x_total{op="subscribe"}; the labels' order
// and spacing need not be the exposition's. A wanted series whose value
// does not parse is an error; anything else the reader cannot read is
// skipped, as it cannot be a wanted series.
func readSeries(r io.Reader, want ...string) (map[string]float64, error) {
	keys := make(map[string]string, len(want)) // canonical form -> as asked
	for _, w := range want {
		k, _, ok := parseSample(w + " 0")
		if !ok {
			return nil, fmt.Errorf("series %q cannot be read", w)
		}
		keys[k] = w
	}
	got := make(map[string]float64, len(want))
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		series, value, ok := parseSample(sc.Text())
		if !ok {
			continue
		}
		w, wanted := keys[series]
		if !wanted {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w, err)
		}
		got[w] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return got, nil
}

// parseSample splits a line of a Prometheus text exposition into its
// series, with the labels in a fixed order so that two spellings of one
// series compare equal, and the text of its value. A comment, a blank line
// and a line it cannot read are not samples.
func parseSample(line string) (series, value string, ok bool) {
	line = strings.TrimSpace(line)
	if line == "" || line[0] == '#' {
		return "", "", false
	}
	i := strings.IndexAny(line, "{ \t")
	if i <= 0 {
		return "", "", false
	}
	series, rest := line[:i], line[i:]
	if rest[0] == '{' {
		labels, after, ok := parseLabels(rest[1:])
		if !ok {
			return "", "", false
		}
		if len(labels) > 0 {
			slices.Sort(labels)
			series += "{" + strings.Join(labels, ",") + "}"
		}
		rest = after
	}
	// A timestamp may follow the value.
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", "", false
	}
	return series, f[0], true
}

// parseLabels reads a sample's labels, from after its opening brace, each
// as name="value" with the value still escaped as in the exposition, and
// returns what follows the closing brace.
func parseLabels(s string) (labels []string, rest string, ok bool) {
	for {
		s = strings.TrimLeft(s, " \t")
		if after, found := strings.CutPrefix(s, "}"); found {
			return labels, after, true
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return nil, "", false
		}
		name := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t")
		if !strings.HasPrefix(s, `"`) {
			return nil, "", false
		}
		// The value ends at the first quote not escaped by a backslash.
		end := 1
		for end < len(s) && s[end] != '"' {
			if s[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(s) {
			return nil, "", false
		}
		labels = append(labels, name+"="+s[:end+1])
		s = strings.TrimLeft(s[end+1:], " \t")
		switch {
		case strings.HasPrefix(s, ","):
			s = s[1:]
		case !strings.HasPrefix(s, "}"):
			return nil, "", false
		}
	}
}

// RelaysHeld returns fn_held_polls summed over the relays' metrics.
func RelaysHeld(ctx context.Context, hc *http.Client, urls []string) (int, error) {
	var n float64
	for _, u := range urls {
		err := scrape(ctx, hc, u, func(r io.Reader) error {
			v, err := parseGauge(r, "fn_held_polls")
			n += v
			return err
		})
		if err != nil {
			return 0, err
		}
	}
	return int(n), nil
}

func round3(v float64) float64 {
	return math.Round(v*1000) / 1000
}
