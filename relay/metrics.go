package relay

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flamenet/relay/internal/poolmetrics"
	"github.com/flamenet/relay/store"
)

// metrics are the API's Prometheus series. They are registered on the
// registry the caller gives; there are no globals.
type metrics struct {
	polls         *prometheus.CounterVec // by outcome
	streams       *prometheus.CounterVec // streams ended, by outcome
	sends         *prometheus.CounterVec // by status code
	stored        prometheus.Counter
	acked         prometheus.Counter
	sendSeconds   prometheus.Histogram
	pollSeconds   prometheus.Histogram
	signalled     prometheus.Counter
	signalErrors  prometheus.Counter
	received      prometheus.Counter
	refusals      *prometheus.CounterVec // by reason
	answersCut    prometheus.Counter
	tokensRefused *prometheus.CounterVec // by reason
	storeCalls    *prometheus.CounterVec // by op
	fleetTroubled prometheus.Gauge
	epochChanges  prometheus.Counter
	memoryDrops   prometheus.Counter
}

// Poll outcomes.
const (
	pollDelivered  = "delivered"  // answered with envelopes
	pollEmpty      = "empty"      // wait ran out (or wait=0) with nothing
	pollSuperseded = "superseded" // a newer poll for the device took over
	pollDrained    = "drained"    // answered because the relay is draining
	pollHangup     = "hangup"     // the client went away
	pollRemoved    = "removed"    // the device was removed while the poll was held
	// Polls answered with an error. Only pollError is the relay's own
	// failure: the others are the client's (anyone can send junk) or a
	// limit doing its job, and an alert on pollError must not fire on them.
	pollUnauthorized = "unauthorized" // 401: no valid token
	pollClientError  = "client_error" // another 4xx: a bad query, a cursor above the head
	pollOverloaded   = "overloaded"   // 503 overloaded: FN_MAX_HELD_POLLS reached
	pollError        = "error"        // 5xx otherwise: the store failed or timed out, a bug
)

var pollOutcomes = []string{pollDelivered, pollEmpty, pollSuperseded, pollDrained, pollHangup, pollRemoved,
	pollUnauthorized, pollClientError, pollOverloaded, pollError}

func newMetrics(reg prometheus.Registerer, s *Server, st store.Store, hub string) (*metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry() // nobody scrapes it; keeps the code free of nil checks
	}
	hubLabel := prometheus.Labels{"hub": hub}
	m := &metrics{
		polls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fn_polls_total", Help: "Polls answered, by outcome.",
		}, []string{"outcome"}),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fn_streams_total", Help: "Streams ended, by outcome (their last event's reason, or hangup or cut).",
		}, []string{"outcome"}),
		sends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fn_sends_total", Help: "Sends answered, by HTTP status code.",
		}, []string{"code"}),
		stored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_envelopes_stored_total", Help: "Envelopes committed (one per recipient of a send; repeats not counted).",
		}),
		acked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_envelopes_acknowledged_total", Help: "Envelopes deleted because a device acknowledged them.",
		}),
		sendSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fn_send_duration_seconds", Help: "Time to answer a send.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		pollSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fn_poll_duration_seconds", Help: "Time to answer a poll, holding included.",
			Buckets: []float64{0.001, 0.005, 0.025, 0.1, 0.5, 1, 5, 10, 20, 30, 60},
		}),
		signalled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_wakeups_signalled_total", Help: "Devices signalled after a commit.", ConstLabels: hubLabel,
		}),
		signalErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_wakeup_signal_errors_total", Help: "Signals the hub failed to deliver (polls fall back to their own timeout).", ConstLabels: hubLabel,
		}),
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_wakeups_received_total", Help: "Wake-ups after which a held poll had something new to read (a fallback round's re-read is not one).", ConstLabels: hubLabel,
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fn_admission_refusals_total", Help: "Requests refused by admission control, by reason.",
		}, []string{"reason"}),
		answersCut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_answers_cut_total", Help: "Connections reset because an answer was not read within its deadline (FN_ANSWER_TIMEOUT plus its size at FN_ANSWER_MIN_RATE).",
		}),
		fleetTroubled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fn_fleet_relays_troubled", Help: "Relays sharing the store whose last report says their wake-ups fail (several relays only).",
		}),
		storeCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fn_store_calls_total", Help: "Calls the API made to the store, by operation.",
		}, []string{"op"}),
		tokensRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fn_tokens_refused_total", Help: "Requests refused with 401, by why the token was refused.",
		}, []string{"reason"}),
		epochChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_store_epoch_changes_total", Help: "Times this relay saw the store's epoch change: its history may have gone back (a restore, a failover that lost commits), and clients resynchronise.",
		}),
		memoryDrops: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_store_memory_drops_total", Help: "Times this relay dropped what it remembers of devices because a check of the store's history failed or found another instance or epoch.",
		}),
	}
	cs := []prometheus.Collector{
		m.polls, m.streams, m.sends, m.stored, m.acked, m.sendSeconds, m.pollSeconds, m.signalled, m.signalErrors, m.received, m.refusals, m.tokensRefused, m.storeCalls, m.fleetTroubled, m.answersCut,
		m.epochChanges, m.memoryDrops,
		// The store's readiness, as /ready reports it (the probe's answer
		// is shared and kept for a second), so that an alert sees a store
		// the relay cannot write even where nothing probes /ready.
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fn_store_ready", Help: "1 when the store answers and can be written (the check behind /ready), else 0; the log says why.",
		}, func() float64 {
			if s.readiness.Store(context.Background()) != nil {
				return 0
			}
			return 1
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fn_held_polls", Help: "Polls held (waiting) now.",
		}, func() float64 { return float64(s.limits.held.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fn_sends_in_flight", Help: "Sends being processed now.",
		}, func() float64 { return float64(len(s.limits.inflight)) }),
		// The limits beside the gauges they bound, so that an alert can
		// compare them (the held-poll cap is derived at start).
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fn_held_polls_limit", Help: "Polls that may be held at once (FN_MAX_HELD_POLLS, or what the open-file limit leaves room for; 0: no cap).",
		}, func() float64 { return float64(s.cfg.MaxHeldPolls) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fn_sends_in_flight_limit", Help: "Sends that may be processed at once (FN_SEND_INFLIGHT).",
		}, func() float64 { return float64(cap(s.limits.inflight)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fn_answer_bytes_in_flight", Help: "Bytes of poll answers being read, encoded and written now.",
		}, func() float64 { return float64(s.limits.answers.total.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fn_answer_bytes_in_flight_limit", Help: "Bytes of poll answers that may be in flight at once (FN_ANSWER_BYTES_IN_FLIGHT, or a quarter of the memory target).",
		}, func() float64 { return float64(s.cfg.AnswerBytesInFlight) }),
	}
	if ps, ok := st.(store.PoolStatser); ok {
		cs = append(cs, poolmetrics.New(ps))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{refusedInflight, refusedRate, refusedHouseholdRate, refusedHeldPolls, refusedDevicePollRate, limitDeviceAnswers, limitRelayAnswers} {
		m.refusals.WithLabelValues(r) // show zero before the first refusal
	}
	for _, r := range tokenRefusalReasons {
		m.tokensRefused.WithLabelValues(r)
	}
	for _, o := range pollOutcomes {
		m.polls.WithLabelValues(o) // rate() over a series needs it before its first increase
	}
	for _, o := range streamOutcomes {
		m.streams.WithLabelValues(o)
	}
	return m, nil
}

// Admission refusal reasons.
const (
	refusedInflight      = "send_inflight"
	refusedRate          = "send_rate"
	refusedHouseholdRate = "household_send_rate"
	refusedHeldPolls     = "held_polls"
	// refusedDevicePollRate: a device's polls came faster than its bucket.
	refusedDevicePollRate = "device_poll_rate"
)

// sendClientGone is the code counted for a send whose client went away
// before its answer (nginx's convention): the store call it cut short
// fails with 503, which is not the relay's failure.
const sendClientGone = "499"

// countSends marks a request as a send, so that its account (finish)
// counts it with its status and times it.
func countSends(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if rec := recordOf(r.Context()); rec != nil {
			rec.send = true
		}
		next(w, r)
	}
}

// timePolls marks a request as a poll, so that its account (finish) counts
// it with its outcome and times it: the handler notes the outcome
// (notePoll), and writeError notes an answer with an error.
func timePolls(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if rec := recordOf(r.Context()); rec != nil {
			rec.poll = true
		}
		next(w, r)
	}
}

// errorOutcome classifies a poll answered with he; gone is true when the
// client went away before the answer.
func errorOutcome(he *httpError, gone bool) string {
	switch {
	case gone:
		return pollHangup
	case he.Status == http.StatusUnauthorized:
		return pollUnauthorized
	case he == errDraining:
		return pollDrained
	case he.Code == codeOverloaded:
		return pollOverloaded
	case he.Status < 500:
		return pollClientError
	}
	return pollError
}
