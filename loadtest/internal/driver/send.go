package driver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/loadtest/internal/answer"
	"github.com/flamenet/relay/loadtest/internal/check"
	"github.com/flamenet/relay/loadtest/internal/schedule"
	"github.com/flamenet/relay/loadtest/internal/wait"
)

// Register creates every recipient, a few at a time. Senders need no
// registration.
func (d *Driver) Register(ctx context.Context) error {
	errs := make(chan error, 1)
	next := make(chan *pair)
	var wg sync.WaitGroup
	for range min(32, len(d.pairs)) {
		wg.Go(func() {
			for p := range next {
				if err := d.registerOne(ctx, p); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for _, p := range d.pairs {
		select {
		case next <- p:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return fmt.Errorf("register recipients: %w", err)
	default:
		return ctx.Err()
	}
}

func (d *Driver) registerOne(ctx context.Context, p *pair) error {
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		l := p.lives[0]
		began := time.Now()
		resp, err := l.clients[p.home].Register(ctx)
		if err == nil {
			p.cursor, l.cursor = resp.Cursor, resp.Cursor
			p.epoch, l.epoch = resp.Epoch, resp.Epoch
			d.tally.Registered(p.idx, 0, began, time.Now())
			return nil
		}
		var se *client.Error
		if !errors.As(err, &se) || !answer.TurnedAway(se) || attempt >= 10 {
			return fmt.Errorf("%s: %w", p.recipient, err)
		}
		wait.For(ctx, max(se.RetryAfter, 100*time.Millisecond))
	}
}

// Offer makes the sends of s, each on time however slowly the relay
// answers the others, and returns when every one has been answered or ctx
// has ended.
func (d *Driver) Offer(ctx context.Context, s schedule.Schedule) {
	schedule.OpenLoop(ctx, s, sendLimit(d.cfg.Pairs), func(i int, at time.Time) { d.send(ctx, i, at) })
}

// send makes send i from its pair's sender, due at the time given, and
// records its answer.
func (d *Driver) send(ctx context.Context, i int, at time.Time) {
	p := d.pairs[d.PairOf(i)]
	// Retries stay on the relay drawn: each failure is counted against
	// the relay that gave it.
	relay := d.sendRelayOf(p, i)
	id := d.tally.SendID(i)
	to, body := []string{p.recipient}, check.Payload(id, d.cfg.Payload)
	started := time.Now()
	d.tally.Started(i, started, at)

	var resp client.SendResult
	var err error
	from := started
	for attempt := 0; ; attempt++ {
		resp, err = p.sendClients[relay].SendOnce(ctx, id, to, body)
		if err == nil || ctx.Err() != nil || !d.cfg.Careful || !answer.Retryable(err) || time.Now().After(d.giveUp) {
			break
		}
		d.tally.Failure("send", relay, err, from, time.Now())
		wait.For(ctx, answer.RetryWait(attempt, err))
		from = time.Now()
	}
	d.tally.Answered(ctx, i, relay, resp, err, from, time.Now())
}

// Sweep polls every recipient once more without waiting, after the held
// polls ended, until the relay says nothing more is waiting.
func (d *Driver) Sweep(ctx context.Context) {
	next := make(chan *pair)
	var wg sync.WaitGroup
	for range min(32, len(d.pairs)) {
		wg.Go(func() {
			for p := range next {
				for attempt := 0; attempt < 20 && ctx.Err() == nil; attempt++ {
					more, err := d.pollOnce(ctx, p, 0)
					if err == nil && !more {
						break
					}
				}
			}
		})
	}
	for _, p := range d.pairs {
		select {
		case next <- p:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
}
