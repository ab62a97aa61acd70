// Package ready is whether a relay is ready for traffic, as /ready and
// fn_store_ready say: not while it drains, and only while the store's
// probe passes. Probes come unauthenticated and from anywhere, so
// however many arrive the store is asked at most once at a time and about
// once per TTL.
package ready

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// TTL is how long an answer of the store's probe is reused.
const TTL = time.Second

// State is safe for concurrent use. The zero value is not; call New.
type State struct {
	ping     func(context.Context) error
	log      *slog.Logger // a change of the probe's answer is logged
	draining atomic.Bool

	mu      sync.Mutex
	checked time.Time
	err     error
	running chan struct{} // closed when the probe in flight answers
}

// New returns the state of a relay whose store answers ping.
func New(ping func(context.Context) error, log *slog.Logger) *State {
	return &State{ping: ping, log: log}
}

// Drain marks the relay draining, for good.
func (s *State) Drain() { s.draining.Store(true) }

// Draining reports whether Drain was called.
func (s *State) Draining() bool { return s.draining.Load() }

// Store runs the store's probe, or waits for the one in flight, or
// answers the last one's outcome if it is younger than TTL.
func (s *State) Store(ctx context.Context) error {
	s.mu.Lock()
	if !s.checked.IsZero() && time.Since(s.checked) < TTL {
		err := s.err
		s.mu.Unlock()
		return err
	}
	if ch := s.running; ch != nil {
		s.mu.Unlock()
		select {
		case <-ch:
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ch := make(chan struct{})
	s.running = ch
	s.mu.Unlock()

	// Not the prober's own context: its hanging up must not fail the
	// probe that others are waiting for.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	err := s.ping(pctx)
	cancel()

	s.mu.Lock()
	was := s.err
	s.err, s.checked, s.running = err, time.Now(), nil
	s.mu.Unlock()
	close(ch)
	switch {
	case err != nil && (was == nil || was.Error() != err.Error()):
		s.log.Error("not ready: the store's probe fails", "err", err)
	case err == nil && was != nil:
		s.log.Info("ready again: the store's probe passes")
	}
	return err
}
