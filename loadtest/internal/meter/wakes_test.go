package meter

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flamenet/relay/loadtest/report"
)

// wakeRelay is a relay's registry with the wake-up series, as wake/redis
// and relay register them; old leaves out the device subscriptions, as a
// relay older than them does.
type wakeRelay struct {
	received, unheld  prometheus.Counter
	changes, commands *prometheus.CounterVec
	subs, held        prometheus.Gauge
	url               string
}

func newWakeRelay(t *testing.T, old bool) *wakeRelay {
	t.Helper()
	r := &wakeRelay{
		received: prometheus.NewCounter(prometheus.CounterOpts{Name: "fn_redis_wakeups_received_total"}),
		unheld:   prometheus.NewCounter(prometheus.CounterOpts{Name: "fn_redis_wakeups_unheld_total"}),
		changes:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fn_redis_device_subscription_changes_total"}, []string{"op"}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fn_redis_device_subscription_commands_total"}, []string{"op"}),
		subs:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "fn_redis_device_subscriptions"}),
		held:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "fn_held_polls"}),
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(r.received, r.unheld, r.held)
	if !old {
		reg.MustRegister(r.changes, r.commands, r.subs)
		for _, op := range []string{"subscribe", "unsubscribe"} {
			r.changes.WithLabelValues(op)
			r.commands.WithLabelValues(op)
		}
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

func ptr(v float64) *float64 { return &v }

// TestReadWakes reads two relays, a current one and an older one without
// the device subscriptions, and one that is down, at a window's start and
// end: counters are their increase, gauges their value at the end, and
// what a relay lacks stays absent.
func TestReadWakes(t *testing.T) {
	cur, old := newWakeRelay(t, false), newWakeRelay(t, true)
	cur.received.Add(10)
	cur.changes.WithLabelValues("subscribe").Add(100)
	old.received.Add(3)
	ctx := context.Background()
	urls := []string{cur.url, old.url, ""}
	start := ReadWakes(ctx, http.DefaultClient, urls)

	cur.received.Add(1234)
	cur.unheld.Add(12)
	cur.changes.WithLabelValues("subscribe").Add(5000)
	cur.changes.WithLabelValues("unsubscribe").Add(40)
	cur.commands.WithLabelValues("subscribe").Add(3)
	cur.subs.Set(5000)
	cur.held.Set(4990)
	old.received.Add(7)
	old.held.Set(20)
	end := ReadWakes(ctx, http.DefaultClient, urls)

	for i, want := range []report.RelayWakes{
		{Relay: 0, Received: ptr(1234), Unheld: ptr(12), Subscribes: ptr(5000), Unsubscribes: ptr(40),
			SubscribeCommands: ptr(3), UnsubscribeCommands: ptr(0), SubscriptionsEnd: ptr(5000), HeldPollsEnd: ptr(4990)},
		{Relay: 1, Received: ptr(7), Unheld: ptr(0), HeldPollsEnd: ptr(20)},
		{Relay: 2},
	} {
		if (start[i].Err != nil) != (urls[i] == "") || (end[i].Err != nil) != (urls[i] == "") {
			t.Errorf("relay %d: errors %v, %v", i, start[i].Err, end[i].Err)
		}
		got, restarted := WakesOver(i, start[i], end[i])
		if restarted {
			t.Errorf("relay %d taken for restarted", i)
		}
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		if string(g) != string(w) {
			t.Errorf("relay %d: got %s, want %s", i, g, w)
		}
	}
}

// TestWakesOverRestart: a relay restarted in the window began its counters
// again, so none is given; its gauges still are.
func TestWakesOverRestart(t *testing.T) {
	reading := func(text string) WakeReading {
		series, err := readSeries(strings.NewReader(text), wakeSeries...)
		if err != nil {
			t.Fatal(err)
		}
		return WakeReading{series: series}
	}
	start := reading("process_start_time_seconds 1000\nfn_redis_wakeups_received_total 50\nfn_held_polls 10\n")
	for name, end := range map[string]WakeReading{
		"new start time":    reading("process_start_time_seconds 1060\nfn_redis_wakeups_received_total 80\nfn_held_polls 9\n"),
		"counter went back": reading("fn_redis_wakeups_received_total 20\nfn_held_polls 9\n"),
	} {
		w, restarted := WakesOver(1, start, end)
		if !restarted || w.Received != nil || w.HeldPollsEnd == nil || *w.HeldPollsEnd != 9 || w.Relay != 1 {
			t.Errorf("%s: restarted %v, %+v", name, restarted, w)
		}
	}
	end := reading("process_start_time_seconds 1000\nfn_redis_wakeups_received_total 80\n")
	if w, restarted := WakesOver(0, start, end); restarted || w.Received == nil || *w.Received != 30 || w.HeldPollsEnd != nil {
		t.Errorf("same process: restarted %v, %+v", restarted, w)
	}
}
