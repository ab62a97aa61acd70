package relay

import (
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Which limit refused a request, in the error body's "limit" field.
const (
	limitSendInflight     = "send_inflight"
	limitSendRate         = "send_rate"
	limitHouseholdRate    = "household_send_rate"
	limitDevicePending    = "device_pending"
	limitHouseholdPending = "household_pending"
)

// admit passes a household's send through the in-flight limit, the
// household's own token bucket and the relay's. The household's bucket
// comes first, so one household's burst spends its own tokens, not the
// ones every household shares.
func (s *Server) admit(household string) (release func(), err error) {
	select {
	case s.inflight <- struct{}{}:
	default:
		s.metrics.refusals.WithLabelValues(refusedInflight).Inc()
		return nil, rateLimited(limitSendInflight, "Too many sends in flight; try again.")
	}
	if !s.households.allow(household, s.now()) {
		<-s.inflight
		s.metrics.refusals.WithLabelValues(refusedHouseholdRate).Inc()
		return nil, rateLimited(limitHouseholdRate, "This household sends too fast; try again.")
	}
	if !s.limiter.Allow() {
		<-s.inflight
		s.metrics.refusals.WithLabelValues(refusedRate).Inc()
		return nil, rateLimited(limitSendRate, "Too many sends; try again.")
	}
	return func() { <-s.inflight }, nil
}

func rateLimited(limit, msg string) *httpError {
	return &httpError{Status: http.StatusTooManyRequests, Code: codeRateLimited, Limit: limit, Message: msg}
}

// households holds each household's send bucket. A bucket that has filled
// up again is the same as a new one, so idle households are forgotten
// whenever the map grows past householdsSweep: memory follows the
// households sending now, not every household ever seen.
type households struct {
	rate  rate.Limit
	burst int

	mu sync.Mutex
	m  map[string]*rate.Limiter
}

// householdsSweep is the map size past which idle buckets are dropped.
const householdsSweep = 4096

func newHouseholds(r float64, burst int) households {
	return households{rate: rate.Limit(r), burst: burst, m: make(map[string]*rate.Limiter)}
}

func (h *households) allow(household string, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	l, ok := h.m[household]
	if !ok {
		if len(h.m) >= householdsSweep {
			for k, v := range h.m {
				if v.TokensAt(now) >= float64(h.burst) {
					delete(h.m, k)
				}
			}
		}
		l = rate.NewLimiter(h.rate, h.burst)
		h.m[household] = l
	}
	return l.AllowN(now, 1)
}
