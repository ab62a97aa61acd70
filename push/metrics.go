package push

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics mirrors the queue's counters in Prometheus. A nil *metrics (no
// Registerer) does nothing. No device or household names as labels: the
// only labels are the provider kind and the drop reason.
type metrics struct {
	queued    prometheus.Gauge
	atCap     prometheus.Gauge
	deferred  prometheus.Counter
	attempted prometheus.Counter
	coalesced prometheus.Counter
	sent      prometheus.Counter
	gone      prometheus.Counter
	dropped   *prometheus.CounterVec
	failed    *prometheus.CounterVec
	retries   *prometheus.CounterVec
	duration  *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer, providers map[string]Provider, queueSize int) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		queued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fn_push_queued", Help: "Pushes waiting for a worker.",
		}),
		atCap: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fn_push_households_at_cap", Help: "Households with pushes waiting that already have their most pushes in flight.",
		}),
		deferred: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_push_household_deferred_total", Help: "Pushes held back because their household already had its most pushes in flight; other households' pushes went first.",
		}),
		attempted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_push_attempted_total", Help: "Pushes offered to the queue, coalesced ones excepted.",
		}),
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_push_coalesced_total", Help: "Pushes folded into one already queued for the same device.",
		}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_push_sent_total", Help: "Pushes the provider accepted.",
		}),
		gone: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_push_gone_total", Help: "Pushes whose target the provider said is gone (also counted as failed).",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fn_push_dropped_total", Help: "Pushes dropped before they were sent, by reason.",
		}, []string{"reason"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fn_push_failed_total", Help: "Pushes given up, gone targets included, by provider.",
		}, []string{"provider"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fn_push_retries_total", Help: "Retries after a 429 or 5xx, by provider.",
		}, []string{"provider"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fn_push_duration_seconds",
			Help:    "Time to send one push, retries included, by provider.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"provider"}),
	}
	// The limit beside the gauge it bounds, so an alert can compare them.
	capacity := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fn_push_queue_capacity", Help: "Pushes that may wait (FN_PUSH_QUEUE); past it pushes are dropped.",
	})
	capacity.Set(float64(queueSize))
	for _, c := range []prometheus.Collector{capacity, m.queued, m.atCap, m.deferred, m.attempted, m.coalesced, m.sent, m.gone, m.dropped, m.failed, m.retries, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("push: register metrics: %w", err)
		}
	}
	// Every series exists from the start, so a rate() sees its first
	// increase.
	for _, r := range dropReasonNames {
		m.dropped.WithLabelValues(r)
	}
	for kind := range providers {
		m.failed.WithLabelValues(kind)
		m.retries.WithLabelValues(kind)
		m.duration.WithLabelValues(kind)
	}
	return m, nil
}

func (m *metrics) setQueued(n int) {
	if m != nil {
		m.queued.Set(float64(n))
	}
}

func (m *metrics) setAtCap(n int) {
	if m != nil {
		m.atCap.Set(float64(n))
	}
}

func (m *metrics) deferral() {
	if m != nil {
		m.deferred.Inc()
	}
}

func (m *metrics) attempt() {
	if m != nil {
		m.attempted.Inc()
	}
}

func (m *metrics) coalesce() {
	if m != nil {
		m.coalesced.Inc()
	}
}

func (m *metrics) send() {
	if m != nil {
		m.sent.Inc()
	}
}

func (m *metrics) drop(r dropReason, n int) {
	if m != nil {
		m.dropped.WithLabelValues(dropReasonNames[r]).Add(float64(n))
	}
}

func (m *metrics) fail(kind string, gone bool) {
	if m != nil {
		m.failed.WithLabelValues(kind).Inc()
		if gone {
			m.gone.Inc()
		}
	}
}

func (m *metrics) retry(kind string) {
	if m != nil {
		m.retries.WithLabelValues(kind).Inc()
	}
}

func (m *metrics) observe(kind string, d time.Duration) {
	if m != nil {
		m.duration.WithLabelValues(kind).Observe(d.Seconds())
	}
}
