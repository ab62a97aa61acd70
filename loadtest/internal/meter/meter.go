// Package meter measures what a run costs and where it runs: the relays'
// CPU time and resident memory (from /proc for relays the tester started,
// from their metrics for others), the polls they hold, Redis's clients,
// and the machine and checkout the run is on.
package meter

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/flamenet/relay/loadtest/report"
)

// Meter reads what the relay processes cost.
type Meter interface {
	// CPU returns the relay's CPU time so far, summed over its processes.
	CPU(ctx context.Context) (time.Duration, error)
	// Read returns the relay's cost; cpuStart is CPU's at the window's
	// start.
	Read(ctx context.Context, cpuStart time.Duration) report.Relay
	// RSS returns the relay's resident memory now, summed over its
	// processes.
	RSS(ctx context.Context) (int64, error)
}

// Processes are relay processes the tester started: the throwaway stack.
type Processes interface {
	// Usage sums the relays' CPU time, their peak resident memory, and
	// their resident memory now.
	Usage() (cpu time.Duration, peak, rss int64, err error)
	// Replicas returns how many relays there are.
	Replicas() int
}

// Proc reads /proc of the relay processes this tester started. A relay
// the tester crashed and restarted counts with every process it had.
type Proc struct {
	st  Processes
	git *report.Git // the relay binary's commit when not the checkout's
}

// NewProc returns the meter of st; git names the relay binary's commit
// when it is not the checkout's, else nil.
func NewProc(st Processes, git *report.Git) *Proc {
	return &Proc{st: st, git: git}
}

// CPU returns the relays' CPU time so far.
func (m *Proc) CPU(context.Context) (time.Duration, error) {
	cpu, _, _, err := m.st.Usage()
	return cpu, err
}

// Read returns the relays' cost since cpuStart.
func (m *Proc) Read(ctx context.Context, cpuStart time.Duration) report.Relay {
	out := report.Relay{Source: "proc", Processes: m.st.Replicas(), Git: m.git}
	// The peak is each relay's own peak resident set (VmHWM, so nothing is
	// missed between samples), summed.
	if c, peak, _, err := m.st.Usage(); err == nil {
		out.CPUSeconds = round3((c - cpuStart).Seconds())
		out.CPUSecondsTotal = round3(c.Seconds())
		out.PeakRSSBytes = peak
	}
	return out
}

// RSS returns the relays' resident memory now.
func (m *Proc) RSS(context.Context) (int64, error) {
	_, _, rss, err := m.st.Usage()
	return rss, err
}

// Metrics scrapes relays this tester did not start. Resident memory is
// only a current value there, so it is sampled every second
// ([Metrics.Loop]) and
// the highest sum kept.
type Metrics struct {
	urls []string
	hc   *http.Client

	mu   sync.Mutex
	peak int64
}

// NewMetrics returns the meter that scrapes the relays' metrics at urls
// with hc.
func NewMetrics(urls []string, hc *http.Client) *Metrics {
	return &Metrics{urls: urls, hc: hc}
}

func (m *Metrics) scrape(ctx context.Context) (time.Duration, int64, error) {
	var cpu float64
	var rss int64
	var errs []error
	for _, u := range m.urls {
		c, r, err := scrapeProcess(ctx, m.hc, u)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cpu += c
		rss += r
	}
	if err := errors.Join(errs...); err != nil {
		return 0, 0, err
	}
	m.mu.Lock()
	m.peak = max(m.peak, rss)
	m.mu.Unlock()
	return time.Duration(cpu * float64(time.Second)), rss, nil
}

// CPU returns the relays' CPU time so far.
func (m *Metrics) CPU(ctx context.Context) (time.Duration, error) {
	c, _, err := m.scrape(ctx)
	return c, err
}

// Read returns the relays' cost since cpuStart.
func (m *Metrics) Read(ctx context.Context, cpuStart time.Duration) report.Relay {
	out := report.Relay{Source: "metrics", Processes: len(m.urls)}
	if c, _, err := m.scrape(ctx); err == nil {
		out.CPUSeconds = round3((c - cpuStart).Seconds())
		out.CPUSecondsTotal = round3(c.Seconds())
	}
	m.mu.Lock()
	out.PeakRSSBytes = m.peak
	m.mu.Unlock()
	return out
}

// RSS returns the relays' resident memory now.
func (m *Metrics) RSS(ctx context.Context) (int64, error) {
	_, rss, err := m.scrape(ctx)
	return rss, err
}

// Loop scrapes every second until ctx ends, for the peak.
func (m *Metrics) Loop(ctx context.Context) {
	everySecond(ctx, func() { _, _, _ = m.scrape(ctx) })
}

// everySecond calls fn every second until ctx ends.
func everySecond(ctx context.Context, fn func()) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			fn()
		}
	}
}
