// Package fleet lets relays that share a store learn of each other's
// wake-up trouble through the store, which every relay reaches even when
// one of them cannot reach Redis.
package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/wake"
)

// Hub is a wake hub shared by several relays (wake/redis): it can say
// whether its own wake-ups flow, and be told to fall back to re-reading
// the store while another relay's do not.
type Hub interface {
	Health() error
	Degrade(until time.Time)
}

// Member is one relay's part in the fleet. Each second it reports whether
// its own wake-ups flow and reads the others' reports, in one store call:
//
//   - while any relay reports trouble, this one falls back (held polls
//     re-read the store every fallback interval), because that relay's
//     sends may wake nobody here;
//   - while this relay's own wake-ups have failed for SickAfter and another
//     relay's flow, /ready fails: the trouble is this relay's (a wrong
//     address, a network cut), and a load balancer should send clients to
//     the healthy ones. When every relay is in trouble (Redis is down),
//     they all stay ready: they serve by re-reading the store, which beats
//     serving nothing.
type Member struct {
	id    string
	store store.Fleet
	hub   Hub
	every time.Duration
	log   *slog.Logger
	errs  rate.Sometimes

	troubled prometheus.Gauge

	mu        sync.Mutex
	sickSince time.Time // zero while this relay's wake-ups flow
	othersOK  bool      // another relay reported flowing wake-ups lately
	unready   bool      // Ready's last answer was not nil

	stop chan struct{}
	done chan struct{}
}

const (
	// fleetEvery is how often a relay reports and reads the others.
	fleetEvery = time.Second
	// fleetWindow: a report older than this is of a relay that is gone.
	fleetWindow = 3 * fleetEvery
	// SickAfter is how long this relay's own wake-ups must have failed
	// before /ready says so.
	SickAfter = 5 * time.Second
)

// New returns the member, not started; troubled is set to how many relays
// report trouble.
func New(st store.Fleet, hub Hub, log *slog.Logger, troubled prometheus.Gauge) *Member {
	return &Member{
		id: relayID(), store: st, hub: hub, every: fleetEvery, log: log, troubled: troubled,
		errs: rate.Sometimes{First: 1, Interval: time.Minute},
		stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// Start reports and reads every second until Stop.
func (f *Member) Start() { go f.run() }

// Stop ends the rounds and waits for the last one.
func (f *Member) Stop() {
	close(f.stop)
	<-f.done
}

// relayID names this process among the relays: the host and a random tag,
// so that a restart is a new relay.
func relayID() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%.40s-%s", host, hex.EncodeToString(b))
}

func (f *Member) run() {
	defer close(f.done)
	t := time.NewTicker(f.every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			f.round(time.Now())
		case <-f.stop:
			return
		}
	}
}

func (f *Member) round(now time.Time) {
	err := f.hub.Health()
	ownOK := err == nil || errors.Is(err, wake.ErrDegraded)
	ctx, cancel := context.WithTimeout(context.Background(), f.every)
	defer cancel()
	reports, rerr := f.store.ReportHealth(ctx, store.RelayHealth{ID: f.id, WakesOK: ownOK, At: now}, now.Add(-fleetWindow))
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case ownOK:
		f.sickSince = time.Time{}
	case f.sickSince.IsZero():
		f.sickSince = now
	}
	if rerr != nil {
		f.errs.Do(func() { f.log.Warn("reporting wake-up health to the store failed", "err", rerr) })
		return // keep what was learned last
	}
	troubled, othersOK := 0, false
	for _, r := range reports {
		switch {
		case !r.WakesOK:
			troubled++
		case r.ID != f.id:
			othersOK = true
		}
	}
	f.othersOK = othersOK
	f.troubled.Set(float64(troubled))
	if troubled > 0 {
		// Until a little past the next round, which renews it.
		f.hub.Degrade(now.Add(2 * f.every))
	}
}

// Ready is nil unless this relay's own wake-ups have failed for SickAfter
// while another relay's flow.
//
// A change of its answer is logged, once: /ready asks at every probe.
func (f *Member) Ready(now time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var err error
	if !f.sickSince.IsZero() && now.Sub(f.sickSince) >= SickAfter && f.othersOK {
		err = fmt.Errorf("wake-ups failing here since %s while other relays' flow: %w", f.sickSince.Format(time.RFC3339), f.hub.Health())
	}
	switch {
	case err != nil && !f.unready:
		f.log.Error("not ready: wake-ups fail here while other relays' flow", "err", err)
	case err == nil && f.unready:
		f.log.Info("ready again: wake-ups flow here")
	}
	f.unready = err != nil
	return err
}
