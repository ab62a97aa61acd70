package relay

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/flamenet/relay/device"
)

// Which limit refused a request, in the error body's "limit" field.
const (
	limitSendInflight     = "send_inflight"
	limitSendRate         = "send_rate"
	limitHouseholdRate    = "household_send_rate"
	limitDevicePending    = "device_pending"
	limitHouseholdPending = "household_pending"
	limitDevicePollRate   = "device_poll_rate"
)

// admit passes a household's send through the in-flight limit, the
// household's own token bucket and the relay's. The household's bucket
// comes first, so one household's burst spends its own tokens, not the
// ones every household shares.
//
// Sends fill the in-flight limit on their own when the store stops
// answering (each waits up to the store's deadline): a failover, an
// outage. Then the refusal is the store's 503, not the client's 429,
// which would tell it that it sends too much.
func (s *Server) admit(ctx context.Context, household string) (release func(), err error) {
	select {
	case s.limits.inflight <- struct{}{}:
	default:
		s.metrics.refusals.WithLabelValues(refusedInflight).Inc()
		if err := s.readiness.Store(ctx); err != nil {
			return nil, &httpError{Status: http.StatusServiceUnavailable, Code: codeUnavailable,
				Message: "The store is not answering; try again.", Cause: err}
		}
		return nil, rateLimited(limitSendInflight, "Too many sends in flight; try again.")
	}
	if !s.limits.households.Allow(household, s.now()) {
		<-s.limits.inflight
		s.metrics.refusals.WithLabelValues(refusedHouseholdRate).Inc()
		return nil, rateLimited(limitHouseholdRate, "This household sends too fast; try again.")
	}
	if !s.limits.limiter.Allow() {
		<-s.limits.inflight
		s.metrics.refusals.WithLabelValues(refusedRate).Inc()
		return nil, rateLimited(limitSendRate, "Too many sends; try again.")
	}
	return func() { <-s.limits.inflight }, nil
}

func rateLimited(limit, msg string) *httpError {
	return &httpError{Status: http.StatusTooManyRequests, Code: codeRateLimited, Limit: limit, Message: msg}
}

// admitPoll passes a poll whose device's cursor, acknowledged, stands at
// cursor. A poll that moved the cursor past every earlier poll of the
// device is free: it is progress, and there is at most one per envelope
// delivered. Any other (a held poll's end, a re-read of what was already
// answered) takes a token from the device's bucket, which a correct client
// never empties.
func (s *Server) admitPoll(k device.Key, cursor int64) error {
	if s.limits.devicePolls.AllowProgress(k, cursor, s.now()) {
		return nil
	}
	s.metrics.refusals.WithLabelValues(refusedDevicePollRate).Inc()
	return rateLimited(limitDevicePollRate, "This device polls too fast without moving its cursor; try again.")
}

// gates lets one send at a time per device reach the store from this relay.
// Sends to one device queue behind each other in the store anyway (they
// take its row); queued here instead, a device whose row someone holds (a
// frozen replica, an operator's transaction) ties up one pooled connection,
// not all of them, and sends to other devices go on. A send waits for its
// recipients' gates no longer than the store's lock timeout, and is then
// refused with 503 as a send that timed out on the lock would be. A store
// with a single writer (SQLite) queues sends itself, in its group commit,
// and gets no gates: nothing else can hold its rows, and gating there would
// keep sends to one device out of one group.
type gates struct {
	mu sync.Mutex
	m  map[device.Key]*gate
}

type gate struct {
	ch   chan struct{} // holds a token while a send is in the store
	refs int           // sends holding or waiting for it
}

var errBusy = &httpError{Status: http.StatusServiceUnavailable, Code: codeUnavailable, Message: "A recipient is busy; try again."}

// enter takes the gates of household's devices in to (sorted, so that two
// sends never wait for each other crosswise), waiting at most wait.
func (g *gates) enter(ctx context.Context, household string, to []string, wait time.Duration) (leave func(), err error) {
	// The wait's deadline (a timer) is made only when another send holds
	// a gate: most sends find theirs free.
	var waitCtx context.Context
	taken := make([]*gate, 0, len(to))
	keys := make([]device.Key, 0, len(to))
	leave = func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		for i, e := range taken {
			<-e.ch
			g.unref(keys[i], e)
		}
	}
	for _, d := range to {
		k := device.KeyOf(household, d)
		g.mu.Lock()
		if g.m == nil {
			g.m = make(map[device.Key]*gate)
		}
		e := g.m[k]
		if e == nil {
			e = &gate{ch: make(chan struct{}, 1)}
			g.m[k] = e
		}
		e.refs++
		g.mu.Unlock()
		select {
		case e.ch <- struct{}{}:
			taken, keys = append(taken, e), append(keys, k)
			continue
		default:
		}
		if waitCtx == nil {
			var cancel context.CancelFunc
			waitCtx, cancel = context.WithTimeout(ctx, wait)
			defer cancel()
		}
		select {
		case e.ch <- struct{}{}:
			taken, keys = append(taken, e), append(keys, k)
		case <-waitCtx.Done():
			g.mu.Lock()
			g.unref(k, e)
			g.mu.Unlock()
			leave()
			return nil, errBusy
		}
	}
	return leave, nil
}

// unref drops one holder or waiter; the caller holds mu.
func (g *gates) unref(k device.Key, e *gate) {
	if e.refs--; e.refs == 0 {
		delete(g.m, k)
	}
}
