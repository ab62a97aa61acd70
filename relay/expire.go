package relay

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flamenet/relay/store"
)

// dedupeWindow is how long a send id is remembered at least (the protocol); the
// store keeps it longer while any envelope of the send is stored.
const dedupeWindow = 24 * time.Hour

// expireBatch bounds the rows one expiry statement deletes, so that it never
// holds a lock a send needs for long.
const expireBatch = 500

// Expirer deletes envelopes older than FN_ENVELOPE_TTL and send records
// past their dedupe window, in the background.
type Expirer struct {
	store     store.Store
	ttl       time.Duration
	now       func() time.Time
	envelopes prometheus.Counter
	sends     prometheus.Counter
	errors    prometheus.Counter
}

// NewExpirer registers the expiry counters on reg (nil: not exported).
func NewExpirer(st store.Store, ttl time.Duration, reg prometheus.Registerer) (*Expirer, error) {
	e := &Expirer{
		store: st, ttl: ttl, now: time.Now,
		envelopes: prometheus.NewCounter(prometheus.CounterOpts{Name: "fn_expired_envelopes_total", Help: "Envelopes deleted unread because they outlived FN_ENVELOPE_TTL."}),
		sends:     prometheus.NewCounter(prometheus.CounterOpts{Name: "fn_expired_sends_total", Help: "Send records deleted after their dedupe window."}),
		errors:    prometheus.NewCounter(prometheus.CounterOpts{Name: "fn_expiry_errors_total", Help: "Expiry passes that failed (retried at the next interval)."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{e.envelopes, e.sends, e.errors} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return e, nil
}

// Once runs one expiry pass.
func (e *Expirer) Once(ctx context.Context) (store.ExpireResult, error) {
	now := e.now()
	res, err := e.store.Expire(ctx, store.ExpireParams{
		EnvelopesBefore: now.Add(-e.ttl),
		SendsBefore:     now.Add(-dedupeWindow),
		Batch:           expireBatch,
	})
	e.envelopes.Add(float64(res.Envelopes))
	e.sends.Add(float64(res.Sends))
	if err != nil {
		e.errors.Inc()
	}
	return res, err
}

// Run expires every interval until ctx ends.
func (e *Expirer) Run(ctx context.Context, every time.Duration, onError func(error)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := e.Once(ctx); err != nil && ctx.Err() == nil {
			onError(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
