package main

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/flamenet/relay/loadtest/report"
)

// relayMeter reads what the relay processes cost.
type relayMeter interface {
	// cpu is the relay's CPU time so far, summed over its processes.
	cpu(ctx context.Context) (time.Duration, error)
	// read returns the relay's cost; cpuStart is cpu at the window's start.
	read(ctx context.Context, cpuStart time.Duration) report.Relay
}

// procMeter reads /proc of relay processes this tester started.
type procMeter struct {
	pids []int
}

func (m *procMeter) cpu(context.Context) (time.Duration, error) {
	var total time.Duration
	for _, pid := range m.pids {
		c, err := procCPU(pid)
		if err != nil {
			return 0, err
		}
		total += c
	}
	return total, nil
}

func (m *procMeter) read(ctx context.Context, cpuStart time.Duration) report.Relay {
	out := report.Relay{Source: "proc", Processes: len(m.pids)}
	if c, err := m.cpu(ctx); err == nil {
		out.CPUSeconds = round3((c - cpuStart).Seconds())
		out.CPUSecondsTotal = round3(c.Seconds())
	}
	for _, pid := range m.pids {
		// VmHWM is the process's peak resident set, so nothing is missed
		// between samples. The sum is of each process's own peak.
		if b, err := procStatusBytes(pid, "VmHWM"); err == nil {
			out.PeakRSSBytes += b
		}
	}
	return out
}

// metricsMeter scrapes relays this tester did not start. Resident memory
// is only a current value there, so it is sampled every second and the
// highest sum kept.
type metricsMeter struct {
	urls []string
	hc   *http.Client

	mu   sync.Mutex
	peak int64
}

func (m *metricsMeter) scrape(ctx context.Context) (time.Duration, int64, error) {
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

func (m *metricsMeter) cpu(ctx context.Context) (time.Duration, error) {
	c, _, err := m.scrape(ctx)
	return c, err
}

func (m *metricsMeter) read(ctx context.Context, cpuStart time.Duration) report.Relay {
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

func (m *metricsMeter) sampleLoop(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			_, _, _ = m.scrape(ctx)
		}
	}
}
