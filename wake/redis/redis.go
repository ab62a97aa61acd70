// Package redis is the wake hub for several relay processes sharing one
// Redis (FN_RELAY_REPLICAS>1).
//
// A send's Signal pushes one item onto each recipient's list
// (<prefix>{household:device}), trims it to one item and gives it a TTL, in
// one pipeline. A held poll waits with BRPOP on its device's list, so a wake
// pushed between the poll's read and its wait is still in the list and the
// wait returns at once. Registration, supersession and drain are those of
// wake/local, on each process: one held poll per device per process.
//
// Each waiting poll holds one pooled Redis connection, so the client's pool
// size is this mode's held-poll ceiling. When Redis fails (down, pool
// exhausted), a wait sleeps Config.Retry and returns nil, a spurious wake
// that makes the poll re-read the store: an outage turns held polls into
// polling and never loses an envelope, because the store, not Redis, holds
// the envelopes.
package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flamenet/relay/wake"
	"github.com/flamenet/relay/wake/local"
)

// Defaults for Config's zero fields.
const (
	DefaultPrefix = "fn:wake:"
	// DefaultTTL is a little over the longest poll wait (60 s), so a wake
	// outlives any poll that could still want it and then goes away.
	DefaultTTL   = 70 * time.Second
	DefaultRetry = time.Second
	DefaultRound = 2 * time.Second
)

// signalTimeout bounds one Signal pipeline (and a wake handed back by an
// abandoned wait). A send has already committed; it must not hang on Redis.
const signalTimeout = time.Second

// minRound is the shortest BRPOP worth sending; closer to the poll's
// deadline the wait just lets the deadline come.
const minRound = 10 * time.Millisecond

// Config tunes a Hub. Zero fields take the defaults above.
type Config struct {
	// Prefix starts every key, e.g. "fn:wake:".
	Prefix string
	// TTL is given to a device's list on every Signal.
	TTL time.Duration
	// Retry is how long a failed Redis wait sleeps before its spurious wake.
	Retry time.Duration
	// Round is the longest single BRPOP, in whole seconds (at least 1 s).
	// A wait loops rounds until its deadline. A poll that returns early
	// (hang-up, supersession, drain) leaves its BRPOP to finish its round in
	// the background, holding its connection for at most Round; Close waits
	// for those, so it too can take up to Round.
	Round time.Duration
	// Observer learns of every wake and removal this process sends or
	// receives; nil: none.
	Observer wake.Observer
	// Logger receives outage and recovery lines (once per transition, not
	// per poll). Nil discards.
	Logger *slog.Logger
}

// Hub is the Redis wake hub. It does not own the client: the caller closes
// it after Close.
type Hub struct {
	client goredis.UniversalClient
	local  *local.Hub
	cfg    Config
	log    *slog.Logger

	// ctx ends background BRPOP rounds at Close.
	ctx    context.Context
	cancel context.CancelFunc

	// mu orders wg.Add against Close's wg.Wait.
	mu     sync.RWMutex
	closed bool
	wg     sync.WaitGroup

	// failing is set by the first failed wait of an outage and cleared by
	// the first successful BRPOP after it, so each is logged once. At the
	// pool ceiling waits fail and succeed by turns; lastWarn (unix nanos)
	// keeps that from logging more than once per warnEvery, and warned
	// pairs each recovery line with a logged failure.
	failing  atomic.Bool
	warned   atomic.Bool
	lastWarn atomic.Int64
}

// warnEvery is the least time between two "redis wait failed" lines.
const warnEvery = 10 * time.Second

var _ wake.Hub = (*Hub)(nil)

// New returns a hub on client, which may be a single node, a Cluster or a
// Sentinel-managed client (see NewClient). The client's ReadTimeout should
// be above one second (or disabled): a BRPOP shorter than a second is sent
// with it as the read deadline.
func New(client goredis.UniversalClient, cfg Config) *Hub {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Retry <= 0 {
		cfg.Retry = DefaultRetry
	}
	// BRPOP with a whole-second timeout gets go-redis's own read deadline
	// (timeout + 10 s); sub-second rounds are only for a poll's last second.
	cfg.Round = cfg.Round.Truncate(time.Second)
	if cfg.Round <= 0 {
		cfg.Round = DefaultRound
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Hub{
		client: client,
		local:  local.New(cfg.Observer),
		cfg:    cfg,
		log:    log.With("component", "wake_redis"),
		ctx:    ctx,
		cancel: cancel,
	}
}

// Key is the Redis list that holds k's wake. The braces are a Redis Cluster
// hash tag around the whole device identity: one device's commands stay in
// one slot, and the devices of a household spread over the cluster. Names
// cannot contain braces or colons (SPEC), so keys cannot collide.
func (h *Hub) Key(k wake.Key) string {
	return h.cfg.Prefix + "{" + k.Household + ":" + k.Device + "}"
}

// Subscribe registers k's one waiter on this process, superseding an older
// one here. It does no Redis I/O. After Close it returns nil and
// wake.ErrClosed.
func (h *Hub) Subscribe(_ context.Context, k wake.Key) (wake.Waiter, error) {
	lw, err := h.local.SubscribeLocal(k)
	if err != nil {
		return nil, err
	}
	return &Waiter{hub: h, local: lw, key: h.Key(k)}, nil
}

// Signal wakes each device's waiter on this process directly, then pushes
// the wake to Redis for the other processes in one pipeline. The push is
// not cut short by ctx's cancellation (the envelope is committed; the
// sender hanging up must not lose the wake) but is bounded in time. An
// error means only that polls held elsewhere notice late, by their own
// deadline or the next read.
func (h *Hub) Signal(ctx context.Context, wakes []wake.Wake) error {
	if len(wakes) == 0 {
		return nil
	}
	_ = h.local.Signal(ctx, wakes) // cannot fail
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), signalTimeout)
	defer cancel()
	rkeys := make([]string, len(wakes))
	for i, w := range wakes {
		rkeys[i] = h.Key(w.Key)
	}
	if err := h.push(ctx, rkeys); err != nil {
		return fmt.Errorf("wake: redis signal: %w", err)
	}
	return nil
}

// Remove ends k's waiter here and wakes the one held elsewhere, which
// reads the store again and finds the removal.
func (h *Hub) Remove(ctx context.Context, k wake.Key, at time.Time) error {
	_ = h.local.Remove(ctx, k, at) // cannot fail
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), signalTimeout)
	defer cancel()
	if err := h.push(ctx, []string{h.Key(k)}); err != nil {
		return fmt.Errorf("wake: redis remove: %w", err)
	}
	return nil
}

// push leaves one item, with a fresh TTL, in each list, in one round trip.
func (h *Hub) push(ctx context.Context, rkeys []string) error {
	_, err := h.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for _, rk := range rkeys {
			p.LPush(ctx, rk, "1")
			p.LTrim(ctx, rk, 0, 0)
			p.Expire(ctx, rk, h.cfg.TTL)
		}
		return nil
	})
	return err
}

// Observe sets the observer of this process's wakes and removals.
func (h *Hub) Observe(o wake.Observer) { h.local.Observe(o) }

// Held reports whether a poll for k is held on this process.
func (h *Hub) Held(k wake.Key) bool { return h.local.Held(k) }

// Close makes every current and future Wait return wake.ErrClosed at once,
// then waits for the BRPOP rounds still in flight (at most Round). It does
// not close the client. Safe to call more than once.
func (h *Hub) Close() error {
	_ = h.local.Close()
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
	return nil
}

// Waiter is one held poll's registration. Wait is meant to be called by one
// goroutine at a time.
type Waiter struct {
	hub   *Hub
	local *local.Waiter
	key   string
}

var _ wake.Waiter = (*Waiter)(nil)

// Close unregisters the waiter (only if it is still the registered one).
func (w *Waiter) Close() { w.local.Close() }

// Wait blocks until a wake for the device arrives from Redis or from a
// Signal on this process (nil), the waiter is superseded or the hub closes
// (their errors), or ctx ends (ctx.Err(), at once, even while a BRPOP is in
// flight). A failed Redis wait sleeps Config.Retry and returns nil.
func (w *Waiter) Wait(ctx context.Context) error {
	lw := w.local
	if err := lw.Err(); err != nil {
		return err
	}
	select {
	case <-lw.Signaled():
		return nil
	default:
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	deadline, _ := ctx.Deadline()
	p := w.hub.start(w.key, deadline)
	if p == nil {
		return wake.ErrClosed
	}
	var result error
	select {
	case <-lw.Signaled():
	case <-lw.Done():
		result = lw.Err()
	case <-ctx.Done():
		result = ctx.Err()
	case err := <-p.res:
		p.finish(nil)
		if err != nil {
			return w.hub.failed(ctx, lw, err)
		}
		return nil
	}
	p.finish(result)
	return result
}

// failed turns a failed Redis wait into a spurious wake after Retry, so the
// poll re-reads the store: polling, not silence, while Redis is away.
func (h *Hub) failed(ctx context.Context, lw *local.Waiter, err error) error {
	if h.failing.CompareAndSwap(false, true) {
		now := time.Now().UnixNano()
		last := h.lastWarn.Load()
		if now-last >= int64(warnEvery) && h.lastWarn.CompareAndSwap(last, now) {
			h.warned.Store(true)
			h.log.Warn("redis wait failed; held polls fall back to polling", "err", err, "retry", h.cfg.Retry)
		}
	}
	t := time.NewTimer(h.cfg.Retry)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-lw.Signaled():
		return nil
	case <-lw.Done():
		return lw.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pop is one Wait's BRPOP loop, run in a goroutine so that the Wait can
// return at once while a blocked BRPOP finishes its round.
//
// Hand-back: Redis gives a pushed item to the longest-blocked BRPOP, which
// may be one whose Wait has already returned (its client hung up, or a
// newer poll superseded it, maybe on this very process and list). An item
// popped for a Wait that will not re-read the store is pushed back, so the
// poll that does want it still wakes.
type pop struct {
	// res carries the outcome: nil for a popped item, else the error.
	res    chan error
	exited chan struct{} // closed when the Wait has returned
	cancel context.CancelFunc

	mu     sync.Mutex
	gone   bool // the Wait has returned
	repush bool // ...having dropped a delivered item without re-reading
}

func (h *Hub) start(key string, deadline time.Time) *pop {
	ctx, cancel := context.WithCancel(h.ctx)
	p := &pop{res: make(chan error, 1), exited: make(chan struct{}), cancel: cancel}
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.closed {
		cancel()
		return nil
	}
	h.wg.Go(func() { h.run(ctx, key, deadline, p) })
	return p
}

// finish records how the Wait ended; result nil means the poll re-reads
// the store, which covers any item already delivered.
func (p *pop) finish(result error) {
	p.cancel()
	p.mu.Lock()
	p.gone = true
	select {
	case err := <-p.res:
		p.repush = err == nil && result != nil
	default:
	}
	p.mu.Unlock()
	close(p.exited)
}

func (h *Hub) run(ctx context.Context, key string, deadline time.Time, p *pop) {
	for ctx.Err() == nil {
		round := h.cfg.Round
		if !deadline.IsZero() {
			round = min(round, time.Until(deadline))
		}
		if round < minRound {
			return
		}
		got, err := h.brpop(ctx, key, round)
		if err != nil {
			if ctx.Err() != nil {
				return // the Wait is gone; its pool wait was cancelled
			}
			p.deliver(err)
			return
		}
		if h.failing.CompareAndSwap(true, false) && h.warned.CompareAndSwap(true, false) {
			h.log.Info("redis wait recovered; held polls wait again")
		}
		if !got {
			continue
		}
		if !p.deliver(nil) {
			h.handBack(key)
			return
		}
		<-p.exited
		p.mu.Lock()
		repush := p.repush
		p.mu.Unlock()
		if repush {
			h.handBack(key)
		}
		return
	}
}

// deliver hands the outcome to a Wait still waiting; false if it is gone.
func (p *pop) deliver(err error) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return false
	}
	p.res <- err // capacity 1, one send per pop
	return true
}

// brpop blocks up to round for an item on key. Whole-second rounds use
// BRPop, which go-redis gives a read deadline past the timeout; a sub-second
// round (a poll's last second) is sent raw with a fractional timeout and
// the client's ReadTimeout as its read deadline.
func (h *Hub) brpop(ctx context.Context, key string, round time.Duration) (bool, error) {
	var err error
	if round >= time.Second {
		err = h.client.BRPop(ctx, round.Truncate(time.Second), key).Err()
	} else {
		secs := strconv.FormatFloat(round.Seconds(), 'f', 3, 64)
		err = h.client.Do(ctx, "brpop", key, secs).Err()
	}
	switch {
	case errors.Is(err, goredis.Nil):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// handBack pushes a wake that an abandoned wait popped back onto its list.
func (h *Hub) handBack(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), signalTimeout)
	defer cancel()
	if err := h.push(ctx, []string{key}); err != nil {
		// The other poll wakes by its deadline or its own failed wait.
		h.log.Warn("redis wake hand-back failed", "err", err)
	}
}
