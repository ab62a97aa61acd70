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
	var haveCPU, haveRSS bool
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "process_cpu_seconds_total":
			if cpu, err = strconv.ParseFloat(f[1], 64); err != nil {
				return 0, 0, fmt.Errorf("process_cpu_seconds_total: %w", err)
			}
			haveCPU = true
		case "process_resident_memory_bytes":
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return 0, 0, fmt.Errorf("process_resident_memory_bytes: %w", err)
			}
			rss, haveRSS = int64(v), true
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if !haveCPU || !haveRSS {
		return 0, 0, fmt.Errorf("metrics lack process_cpu_seconds_total or process_resident_memory_bytes")
	}
	return cpu, rss, nil
}

// parseGauge reads the value of an unlabelled series from a Prometheus
// text exposition.
func parseGauge(r io.Reader, name string) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == name {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s in the metrics", name)
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
