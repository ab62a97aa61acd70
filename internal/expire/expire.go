// Package expire deletes, in the background, envelopes older than
// FN_ENVELOPE_TTL and send records past their dedupe window.
package expire

import (
	"context"
	"log/slog"
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

// Expirer runs an expiry pass every minute between Start and Stop.
type Expirer struct {
	store     store.Expiry
	ttl       time.Duration
	now       func() time.Time
	log       *slog.Logger
	envelopes prometheus.Counter
	sends     prometheus.Counter
	errors    prometheus.Counter

	stop, done chan struct{}
}

// New registers the expiry counters on reg (nil: not exported); failed
// passes are logged to log.
func New(st store.Expiry, ttl time.Duration, reg prometheus.Registerer, log *slog.Logger) (*Expirer, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Expirer{
		store: st, ttl: ttl, now: time.Now, log: log,
		stop: make(chan struct{}), done: make(chan struct{}),
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

// every is how often a pass runs.
const every = time.Minute

// Start runs a pass now and then every minute, until Stop.
func (e *Expirer) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-e.stop
		cancel() // a pass under way ends too
	}()
	go func() {
		defer close(e.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if _, err := e.Once(ctx); err != nil && ctx.Err() == nil {
				e.log.Warn("expiry pass failed", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// Stop ends the passes and waits for the one under way.
func (e *Expirer) Stop() {
	close(e.stop)
	<-e.done
}
