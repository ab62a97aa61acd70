package meter

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/flamenet/relay/loadtest/report"
)

// The series of a relay's Redis wake-ups that the report takes, as the
// relay names them (wake/redis, relay). processStart tells a restarted
// relay, whose counters began again, from the one that was read before.
const (
	wakesReceived       = "fn_redis_wakeups_received_total"
	wakesUnheld         = "fn_redis_wakeups_unheld_total"
	subscribes          = `fn_redis_device_subscription_changes_total{op="subscribe"}`
	unsubscribes        = `fn_redis_device_subscription_changes_total{op="unsubscribe"}`
	subscribeCommands   = `fn_redis_device_subscription_commands_total{op="subscribe"}`
	unsubscribeCommands = `fn_redis_device_subscription_commands_total{op="unsubscribe"}`
	subscriptions       = "fn_redis_device_subscriptions"
	heldPolls           = "fn_held_polls"
	processStart        = "process_start_time_seconds"
)

var wakeSeries = []string{wakesReceived, wakesUnheld, subscribes, unsubscribes,
	subscribeCommands, unsubscribeCommands, subscriptions, heldPolls, processStart}

// WakeReading is what one relay's metrics said of its Redis wake-ups at
// one moment: the series it exports of those the report takes. A series
// it lacks is absent, and so is every one when it could not be read.
type WakeReading struct {
	series map[string]float64
	// Err says why the relay could not be read; nil if it was.
	Err error
}

// ReadWakes scrapes the wake-up series of the relays whose metrics are at
// urls, all at once so that the readings are of one moment. An empty URL
// is a relay that is down.
func ReadWakes(ctx context.Context, hc *http.Client, urls []string) []WakeReading {
	out := make([]WakeReading, len(urls))
	var wg sync.WaitGroup
	for i, u := range urls {
		if u == "" {
			out[i].Err = errors.New("the relay is not running")
			continue
		}
		wg.Go(func() {
			out[i].Err = scrape(ctx, hc, u, func(r io.Reader) (err error) {
				out[i].series, err = readSeries(r, wakeSeries...)
				return err
			})
		})
	}
	wg.Wait()
	return out
}

// WakesOver returns relay i's wake-ups between the readings start and
// end: a counter's increase, a gauge's value at end. A value either
// reading lacks is absent, never 0. Restarted says the relay's process
// changed between them (its start time changed, or a counter went back):
// what the one before counted is lost, so no counter is given.
func WakesOver(i int, start, end WakeReading) (w report.RelayWakes, restarted bool) {
	w.Relay = i
	if a, ok := start.series[processStart]; ok {
		if b, ok := end.series[processStart]; ok && a != b {
			restarted = true
		}
	}
	increase := func(series string) *float64 {
		a, okA := start.series[series]
		b, okB := end.series[series]
		if !okA || !okB {
			return nil
		}
		if b < a {
			restarted = true
		}
		d := b - a
		return &d
	}
	at := func(series string) *float64 {
		v, ok := end.series[series]
		if !ok {
			return nil
		}
		return &v
	}
	w.Received, w.Unheld = increase(wakesReceived), increase(wakesUnheld)
	w.Subscribes, w.Unsubscribes = increase(subscribes), increase(unsubscribes)
	w.SubscribeCommands, w.UnsubscribeCommands = increase(subscribeCommands), increase(unsubscribeCommands)
	w.SubscriptionsEnd, w.HeldPollsEnd = at(subscriptions), at(heldPolls)
	if restarted {
		w.Received, w.Unheld, w.Subscribes, w.Unsubscribes, w.SubscribeCommands, w.UnsubscribeCommands = nil, nil, nil, nil, nil, nil
	}
	return w, restarted
}
