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
	// rss is the relay's resident memory now, summed over its processes.
	rss(ctx context.Context) (int64, error)
}

// procMeter reads /proc of the relay processes this tester started. A
// relay the tester crashed and restarted counts with every process it had.
type procMeter struct {
	st  *stack
	git *report.Git // the relay binary's commit when not the checkout's
}

func (m *procMeter) cpu(context.Context) (time.Duration, error) {
	cpu, _, _, err := m.st.usage()
	return cpu, err
}

func (m *procMeter) read(ctx context.Context, cpuStart time.Duration) report.Relay {
	out := report.Relay{Source: "proc", Processes: m.st.replicas(), Git: m.git}
	// The peak is each relay's own peak resident set (VmHWM, so nothing is
	// missed between samples), summed.
	if c, peak, _, err := m.st.usage(); err == nil {
		out.CPUSeconds = round3((c - cpuStart).Seconds())
		out.CPUSecondsTotal = round3(c.Seconds())
		out.PeakRSSBytes = peak
	}
	return out
}

func (m *procMeter) rss(context.Context) (int64, error) {
	_, _, rss, err := m.st.usage()
	return rss, err
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

func (m *metricsMeter) rss(ctx context.Context) (int64, error) {
	_, rss, err := m.scrape(ctx)
	return rss, err
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
