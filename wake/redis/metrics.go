package redis

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Fallback round reasons, the label of fn_redis_fallback_rounds_total.
const (
	roundUnhealthy    = "unhealthy"    // every FallbackInterval while unhealthy
	roundDegraded     = "degraded"     // every FallbackInterval while Degrade holds
	roundRecovered    = "recovered"    // once, when health returns
	roundResubscribed = "resubscribed" // once per new subscriber session
	roundPeer         = "peer"         // another relay said it lost wakes
)

type metrics struct {
	received      prometheus.Counter
	unheld        prometheus.Counter
	rounds        *prometheus.CounterVec
	publishErrors prometheus.Counter
	breakerSkips  prometheus.Counter
	reconnects    prometheus.Counter
	displaced     prometheus.Counter
	subChanges    *prometheus.CounterVec
	subCommands   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, h *Hub) (*metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry() // nobody scrapes it; keeps the code free of nil checks
	}
	m := &metrics{
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_redis_wakeups_received_total",
			Help: "Device wake-ups received from other relays through Redis (heartbeats and own messages not counted).",
		}),
		unheld: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_redis_wakeups_unheld_total",
			Help: "Device wake-ups received from other relays for devices with no poll or stream held here: what this relay hears and cannot use.",
		}),
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fn_redis_fallback_rounds_total",
			Help: "Rounds in which every held poll re-read the store because wake-ups may have been missed, by reason.",
		}, []string{"reason"}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_redis_publish_errors_total",
			Help: "Redis publishes (wake-ups, removals, heartbeats) that failed or timed out.",
		}),
		breakerSkips: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_redis_breaker_skips_total",
			Help: "Signals and removals not published because the breaker knew Redis was failing.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_redis_subscriber_reconnects_total",
			Help: "Subscriber sessions lost and opened again.",
		}),
		displaced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fn_redis_devices_moved_away_total",
			Help: "Devices this relay listened for that another relay announced it holds since: this relay's older poll ended as superseded and it left the channel.",
		}),
		subChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fn_redis_device_subscription_changes_total",
			Help: "Device channels subscribed to (op=subscribe, again after a reconnect too) and left (op=unsubscribe).",
		}, []string{"op"}),
		subCommands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fn_redis_device_subscription_commands_total",
			Help: "SUBSCRIBE and UNSUBSCRIBE commands (SSUBSCRIBE and SUNSUBSCRIBE on a Cluster) sent for device channels, by op.",
		}, []string{"op"}),
	}
	cs := []prometheus.Collector{
		m.received, m.unheld, m.rounds, m.publishErrors, m.breakerSkips, m.reconnects, m.displaced, m.subChanges, m.subCommands,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fn_redis_device_subscriptions",
			Help: "Device channels this relay subscribes to, or is about to: the devices it holds, and those it held less than the linger ago.",
		}, func() float64 { return float64(h.subs.count.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fn_redis_healthy",
			Help: "1 while Redis wake-ups work (subscribed, own heartbeat back in time, publishes succeeding), else 0.",
		}, func() float64 {
			if h.Health() == nil {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fn_redis_subscriber_connections",
			Help: "Redis subscriber connections of this relay (one; one per master with a Cluster).",
		}, func() float64 {
			if s := h.sess.Load(); s != nil {
				return float64(len(s.groups))
			}
			return 0
		}),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, op := range []string{"subscribe", "unsubscribe"} {
		m.subChanges.WithLabelValues(op)
		m.subCommands.WithLabelValues(op)
	}
	for _, r := range []string{roundUnhealthy, roundDegraded, roundRecovered, roundResubscribed, roundPeer} {
		m.rounds.WithLabelValues(r) // show zero before the first round
	}
	return m, nil
}
