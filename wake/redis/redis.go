// Package redis is the wake hub for several relay processes sharing one
// Redis (FN_RELAY_REPLICAS>1).
//
// A relay listens only for the devices it holds: each device's wakes go on
// a channel of its own, and a relay subscribes to a device's channel while
// it holds the device's poll or stream, and for Config.Linger after (see
// subs.go). Every relay also subscribes to a fixed set of fleet channels
// (Config.Shards, 16), which carry removals, heartbeats and "lost". It
// does so on one subscriber connection (one per master with a Cluster,
// where every channel is a shard channel: SSUBSCRIBE and SPUBLISH). After
// a commit, Signal wakes the local waiters, then publishes one compact
// message per device, all in one pipeline, from a small command pool. Each
// relay hands what it hears to an in-process hub (wake/local), which keeps
// registration, supersession and drain. A held poll holds no Redis
// connection: the subscriber connections carry every poll of the process.
//
// The invariant: a send committed after a poll's first read wakes that
// poll, wherever the send was accepted. The poll registers locally before
// its first read, and Subscribe returns only once the device's
// subscription is confirmed (or wakes the poll again when it is), so a
// message published after the read reaches the waiter. What Redis may drop
// (while the subscriber reconnects, while Redis is down or paused, a
// publish that failed) is covered by fallback rounds: the Observer forgets
// what it learned and every held poll re-reads the store. A hub runs one
// while it is unhealthy (every FallbackInterval), once when it recovers
// and once per new subscriber session; a relay that failed to publish says
// so on the fleet channels once it can ("lost"), and every other relay
// runs one round for it. What a relay learned of a device it does not
// listen for is not trusted (Hears), and forgotten when it starts
// listening (Observer.Forget).
//
// Health is measured, not assumed: the hub publishes a heartbeat to itself
// every Config.Heartbeat and must hear it back within
// Config.HeartbeatTimeout, which catches a paused or slow Redis as well as
// a dropped connection.
package redis

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/wake"
	"github.com/flamenet/relay/wake/local"
)

// Defaults for Config's zero fields.
const (
	DefaultPrefix           = "fn:wake:"
	DefaultShards           = 16
	DefaultHeartbeat        = 250 * time.Millisecond
	DefaultHeartbeatTimeout = time.Second
	DefaultFallbackInterval = time.Second
	DefaultPublishTimeout   = 250 * time.Millisecond
	DefaultLinger           = 30 * time.Second
)

// Reconnect backoff of the subscriber: short, because while it is away
// every held poll falls back to re-reading the store.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = time.Second
)

// Config tunes a Hub. Zero fields take the defaults above.
type Config struct {
	// Prefix starts every channel name, followed by the database number
	// when the client selects one other than 0 (see channelPrefix). All
	// relays of a fleet must use the same Prefix and Shards; fleets that
	// share a Redis and a database need different Prefixes.
	Prefix string
	// Shards is the number of fleet channels.
	Shards int
	// Linger is how long a device's subscription outlives its last held
	// poll or stream: a device that polls again within it costs Redis
	// nothing.
	Linger time.Duration
	// SubscribeTimeout bounds Subscribe's wait for a new subscription's
	// confirmation; a poll that stops waiting is woken at the
	// confirmation. Zero: HeartbeatTimeout.
	SubscribeTimeout time.Duration
	// Heartbeat is how often the hub publishes a heartbeat to itself.
	Heartbeat time.Duration
	// HeartbeatTimeout is how long after sending it the hub must have
	// heard its heartbeat back; past it the hub is unhealthy. It is also
	// the bound of a Redis that is paused or slow rather than gone. A
	// subscriber that stays silent for three times this long is replaced.
	HeartbeatTimeout time.Duration
	// FallbackInterval is how often, while unhealthy, every held poll is
	// made to re-read the store.
	FallbackInterval time.Duration
	// PublishTimeout bounds one Signal or Remove: a send has committed and
	// must not wait long on Redis.
	PublishTimeout time.Duration
	// Observer hears every wake and removal (local and from other relays)
	// before the waiter is woken or ended, and every fallback round. Nil:
	// none.
	Observer wake.Observer
	// Logger receives one line per outage and one per recovery. Nil
	// discards.
	Logger *slog.Logger
	// Registerer gets the hub's metrics (fn_redis_*). Nil: not exported.
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() (Config, error) {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if c.FallbackInterval == 0 {
		c.FallbackInterval = DefaultFallbackInterval
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.Linger == 0 {
		c.Linger = DefaultLinger
	}
	if c.SubscribeTimeout == 0 {
		c.SubscribeTimeout = c.HeartbeatTimeout
	}
	switch {
	case c.Shards < 1 || c.Shards > 1024:
		return c, fmt.Errorf("wake: redis: Shards %d: want 1 to 1024", c.Shards)
	case c.Heartbeat < 0 || c.HeartbeatTimeout <= c.Heartbeat:
		return c, fmt.Errorf("wake: redis: HeartbeatTimeout (%v) must exceed Heartbeat (%v)", c.HeartbeatTimeout, c.Heartbeat)
	case c.FallbackInterval < 0 || c.PublishTimeout < 0 || c.Linger < 0 || c.SubscribeTimeout < 0:
		return c, errors.New("wake: redis: negative interval")
	}
	return c, nil
}

// ErrBreakerOpen means Redis is known to be failing, so Signal and Remove
// did not try it. Held polls elsewhere learn of the send by a fallback round.
var ErrBreakerOpen = errors.New("wake: redis failing; publish skipped")

var (
	errNotSubscribed = errors.New("wake: redis subscriber not connected")
)

// Hub is the Redis wake hub. It does not own the client: the caller closes
// it after Close.
type Hub struct {
	client   goredis.UniversalClient
	cluster  *goredis.ClusterClient // nil unless a Cluster: sharded pub/sub
	local    *local.Hub
	cfg      Config
	log      *slog.Logger
	m        *metrics
	id       instanceID
	channels []string // the fleet channels

	prefix       string // starts every channel: Config.Prefix and the database
	devicePrefix string // starts every device channel
	subs         *subs
	announce     chan presence // presences to publish
	hooks        hooks

	// epoch is the base of stamp(), the monotonic clock of heartbeats.
	epoch time.Time

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool
	ready  atomic.Bool // New has returned: later sessions need a round

	// first carries the first session's outcome to New: nil when
	// confirmed, or an error Redis answered that retrying will not fix.
	first     chan error
	firstOnce sync.Once

	sess atomic.Pointer[session] // nil while no subscriber session

	// pubErrAt is the stamp of the last failed publish while the breaker
	// is open (0: closed). It closes when a heartbeat sent after that
	// failure is heard back.
	pubErrAt atomic.Int64
	pubErr   atomic.Pointer[error]
	// owesLost: a publish failed or was skipped since the last "lost"
	// message went out, so other relays may have missed wakes.
	owesLost atomic.Bool

	degradedUntil atomic.Int64 // unix nanos; 0: not degraded

	// roundAt is when a requested round is due (stamp; 0: none), and
	// roundWhy its reason. lastRound is the stamp of the last round.
	roundAt   atomic.Int64
	roundWhy  atomic.Pointer[string]
	lastRound atomic.Int64
}

var _ wake.Hub = (*Hub)(nil)

// New checks the settings against Redis, subscribes to the shard channels
// and returns the hub once the subscriptions are confirmed, so that no
// poll can register before wakes reach this process.
//
// It returns an error, and no hub, when Redis answers that the settings
// are wrong (a password, a database, an ACL, a server without sharded
// pub/sub) or the host name does not resolve. A Redis that does not answer
// at all, or not before ctx ends, is not an error: the hub starts
// unhealthy, held polls re-read the store every FallbackInterval, and it
// subscribes as soon as Redis answers. Redis holds no envelope, so a relay
// that refused to start without it would turn a Redis outage into a relay
// outage at the next restart or scale-up.
//
// client may be a single node, a Sentinel-managed client or a Cluster
// (see NewClient).
func New(ctx context.Context, client goredis.UniversalClient, cfg Config) (*Hub, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Hub{
		client:   client,
		local:    local.New(cfg.Observer),
		cfg:      cfg,
		log:      log.With("component", "wake_redis"),
		channels: channelNames(channelPrefix(cfg.Prefix, client), cfg.Shards),
		epoch:    time.Now(),
		first:    make(chan error, 1),
		subs:     newSubs(),
		announce: make(chan presence, announceQueue),
	}
	h.prefix = channelPrefix(cfg.Prefix, client)
	h.devicePrefix = h.prefix + "d:"
	h.cluster, _ = client.(*goredis.ClusterClient)
	if _, err := rand.Read(h.id[:]); err != nil {
		return nil, fmt.Errorf("wake: redis: instance id: %w", err)
	}
	if h.m, err = newMetrics(cfg.Registerer, h); err != nil {
		return nil, fmt.Errorf("wake: redis: metrics: %w", err)
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())

	down := client.Ping(ctx).Err()
	if down != nil && fatal(down) {
		h.cancel()
		return nil, fmt.Errorf("wake: redis: bad settings: %w", down)
	}
	if down != nil {
		h.publishFailed(down) // the breaker starts open
	}
	h.wg.Go(func() { h.subscribeLoop(h.ctx) })
	h.wg.Go(func() { h.heartbeatLoop(h.ctx) })
	h.wg.Go(func() { h.announceLoop(h.ctx) })
	if down == nil {
		select {
		case err := <-h.first:
			if err != nil {
				h.Close()
				return nil, fmt.Errorf("wake: redis refused the subscription: %w", err)
			}
		case <-ctx.Done():
			down = fmt.Errorf("no subscription confirmed: %w", ctx.Err())
		}
	}
	healthy := down == nil
	if !healthy {
		h.log.Warn("redis unreachable at start; held polls re-read the store until it answers",
			"err", down, "fallback_interval", cfg.FallbackInterval)
	}
	h.ready.Store(true)
	h.wg.Go(func() { h.monitor(h.ctx, healthy) })
	return h, nil
}

// channelPrefix returns prefix and the database the client selects. Pub/sub
// channels are the whole server's, whatever database a connection
// selected: without the number, fleets kept apart on one Redis by their
// databases, as their keys are, would wake each other's polls. Database 0
// adds nothing, so the channels of a fleet on it stay what they were.
func channelPrefix(prefix string, client goredis.UniversalClient) string {
	if c, ok := client.(*goredis.Client); ok && c.Options().DB != 0 {
		return prefix + strconv.Itoa(c.Options().DB) + ":"
	}
	return prefix
}

// fatal reports whether err says the settings are wrong, rather than that
// Redis is away for now.
func fatal(err error) bool {
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return dns.IsNotFound
	}
	var rerr goredis.Error
	if !errors.As(err, &rerr) {
		return false // refused, reset, timed out: down, not misconfigured
	}
	for _, p := range []string{"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "MOVED", "ASK", "READONLY"} {
		if strings.HasPrefix(rerr.Error(), p) {
			return false
		}
	}
	return true
}

// stamp returns the hub's monotonic clock in nanoseconds, never 0.
func (h *Hub) stamp() int64 { return int64(time.Since(h.epoch)) + 1 }

// Channels returns the fleet channels, in shard order.
func (h *Hub) Channels() []string { return append([]string(nil), h.channels...) }

// Channel returns the fleet channel that carries k's removal.
func (h *Hub) Channel(k device.Key) string { return h.channels[shardOf(k, h.cfg.Shards)] }

// Held reports whether a poll for k is held on this process.
func (h *Hub) Held(k device.Key) bool { return h.local.Held(k) }

// NotifyAll wakes every waiter held on this relay.
func (h *Hub) NotifyAll() { h.local.NotifyAll() }

// Signal tells the observer and wakes the waiters on this process, then
// publishes one message per device on its channel, in one pipeline. The publish is
// not cut short by ctx's cancellation (the envelopes are committed; the
// sender hanging up must not lose the wake) but is bounded by
// PublishTimeout, and skipped at once (ErrBreakerOpen) while Redis is known
// to be failing. An error means only that polls held elsewhere notice by a
// fallback round.
func (h *Hub) Signal(ctx context.Context, wakes []wake.Wake) error {
	if len(wakes) == 0 {
		return nil
	}
	obs := h.local.Observer()
	held := make([]bool, len(wakes))
	out := make([]outbound, len(wakes))
	for i, w := range wakes {
		if obs != nil {
			obs.Advanced(w)
		}
		// Judged as it is woken: a poll the wake answers may be gone
		// right after, and its device needs no push.
		held[i] = h.local.Notify(w.Key)
		if held[i] {
			w.Push = device.PushTarget{} // nobody pushes a device held here
		}
		out[i] = outbound{h.DeviceChannel(w.Key), appendWake(header(kindWakes, h.id), w)}
	}
	wake.LocalDone(ctx) // before the publish, which waits on Redis
	heard, err := h.publish(ctx, out)
	if p := h.local.Pusher(); p != nil {
		for i, w := range wakes {
			// A relay that listens for the device pushes it unless it
			// holds it; with none listening but this one, it is pushed
			// here. Counting this relay's own subscription out even
			// while it may not be in force yet risks two pushes, never
			// none.
			if !held[i] && !w.Push.Empty() && (err != nil || heard[i]-h.listens(w.Key) <= 0) {
				p.Push(w.Key, w.Push)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("wake: redis signal: %w", err)
	}
	return nil
}

// Remove tells the observer and ends k's waiter on this process, then
// publishes the removal on k's shard, bounded as Signal is.
func (h *Hub) Remove(ctx context.Context, k device.Key, at time.Time) error {
	_ = h.local.Remove(ctx, k, at) // cannot fail
	b := appendRemoval(header(kindRemoval, h.id), k, at)
	if _, err := h.publish(ctx, []outbound{{h.Channel(k), b}}); err != nil {
		return fmt.Errorf("wake: redis remove: %w", err)
	}
	return nil
}

type outbound struct {
	channel string
	payload []byte
}

// publish publishes out and returns how many subscribers heard each.
func (h *Hub) publish(ctx context.Context, out []outbound) ([]int64, error) {
	// After Close the heartbeat stops and would hold the breaker open;
	// sends still finishing during shutdown publish regardless.
	if !h.closed.Load() && h.breakerOpen() {
		h.owesLost.Store(true)
		h.m.breakerSkips.Inc()
		return nil, ErrBreakerOpen
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.PublishTimeout)
	defer cancel()
	heard, err := h.pipeline(ctx, out)
	if err != nil {
		h.publishFailed(err)
		return nil, err
	}
	return heard, nil
}

// pipeline publishes out in one round trip per node: PUBLISH on a single
// node or Sentinel, SPUBLISH (to the channel's slot owner) on a Cluster.
// It returns how many subscribers heard each message.
func (h *Hub) pipeline(ctx context.Context, out []outbound) ([]int64, error) {
	cmds := make([]*goredis.IntCmd, len(out))
	_, err := h.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, o := range out {
			if h.cluster != nil {
				cmds[i] = p.SPublish(ctx, o.channel, o.payload)
			} else {
				cmds[i] = p.Publish(ctx, o.channel, o.payload)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	heard := make([]int64, len(out))
	for i, c := range cmds {
		heard[i] = c.Val()
	}
	return heard, nil
}

// PushVia sets the pusher of wakes whose devices no relay holds.
func (h *Hub) PushVia(p wake.Pusher) { h.local.PushVia(p) }

// Observe sets the observer of this process's wakes and removals, sent
// from here or received.
func (h *Hub) Observe(o wake.Observer) { h.local.Observe(o) }

func (h *Hub) publishFailed(err error) {
	h.pubErr.Store(&err)
	h.pubErrAt.Store(h.stamp())
	h.owesLost.Store(true)
	h.m.publishErrors.Inc()
}

// breakerOpen: a publish failed and no heartbeat sent since has come back
// (on every subscriber connection).
func (h *Hub) breakerOpen() bool { return h.pubErrAt.Load() != 0 }

// Degrade makes the hub run fallback rounds, as if unhealthy, up to the
// time given: for when the relay learns elsewhere that wakes are being
// lost. Publishing goes on as usual.
func (h *Hub) Degrade(until time.Time) {
	h.degradedUntil.Store(until.UnixNano())
}

// Health returns nil while wakes flow: the subscriptions are confirmed, the
// hub's own heartbeat came back within HeartbeatTimeout, publishes
// succeed, and no Degrade holds. Otherwise it says what is wrong, and held
// polls re-read the store every FallbackInterval.
func (h *Hub) Health() error {
	if h.closed.Load() {
		return wake.ErrClosed
	}
	if h.breakerOpen() {
		if p := h.pubErr.Load(); p != nil {
			return fmt.Errorf("wake: redis publishes failing: %w", *p)
		}
	}
	s := h.sess.Load()
	if s == nil || s.confirmedAt.Load() == 0 {
		return errNotSubscribed
	}
	if d := time.Duration(h.stamp() - s.fresh()); d > h.cfg.HeartbeatTimeout {
		return fmt.Errorf("wake: own redis heartbeat not back for %v", d.Round(time.Millisecond))
	}
	if until := h.degradedUntil.Load(); until != 0 && time.Now().UnixNano() < until {
		return fmt.Errorf("%w until %s", wake.ErrDegraded, time.Unix(0, until).Format(time.RFC3339Nano))
	}
	return nil
}

// Close makes every current and future Wait return wake.ErrClosed at once
// and stops the hub's goroutines. Signal and Remove still publish (without
// the breaker) for sends that finish during shutdown. It does not close
// the client. Safe to call more than once.
func (h *Hub) Close() error {
	_ = h.local.Close()
	if h.closed.Swap(true) {
		return nil
	}
	h.cancel()
	h.wg.Wait()
	return nil
}

// round makes every held poll re-read the store: news may have been
// missed. The observer forgets first, so a woken poll finds nothing stale.
func (h *Hub) round(reason string) {
	h.lastRound.Store(h.stamp())
	h.m.rounds.WithLabelValues(reason).Inc() // counted before anyone wakes
	if obs := h.local.Observer(); obs != nil {
		obs.Lost()
	}
	h.local.NotifyAll()
}

// requestRound asks the monitor for a round at or after the stamp at.
func (h *Hub) requestRound(reason string, at int64) {
	h.roundWhy.Store(&reason)
	for {
		cur := h.roundAt.Load()
		if cur != 0 && cur <= at {
			return
		}
		if h.roundAt.CompareAndSwap(cur, at) {
			return
		}
	}
}

// monitor turns health into fallback rounds and log lines: one line per
// outage and one per recovery, a round on each transition, and one every
// FallbackInterval in between. It also runs requested rounds.
func (h *Hub) monitor(ctx context.Context, healthy bool) {
	t := time.NewTicker(max(h.cfg.Heartbeat/5, time.Millisecond))
	defer t.Stop()
	h.lastRound.Store(h.stamp())
	var downSince time.Time
	if !healthy {
		downSince = time.Now()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := h.stamp()
		err := h.Health()
		reason := roundUnhealthy
		if errors.Is(err, wake.ErrDegraded) {
			reason = roundDegraded
		}
		switch {
		case err != nil && healthy:
			healthy, downSince = false, time.Now()
			if reason == roundDegraded {
				h.log.Info("redis wake-ups degraded on request; held polls re-read the store", "err", err)
			} else {
				h.log.Warn("redis wake-ups interrupted; held polls re-read the store", "err", err, "fallback_interval", h.cfg.FallbackInterval)
			}
			h.round(reason)
		case err != nil && time.Duration(now-h.lastRound.Load()) >= h.cfg.FallbackInterval:
			h.round(reason)
		case err == nil && !healthy:
			healthy = true
			h.log.Info("redis wake-ups restored", "after", time.Since(downSince).Round(time.Millisecond))
			h.roundAt.Store(0) // this round covers any requested one
			h.round(roundRecovered)
		}
		if at := h.roundAt.Load(); at != 0 && now >= at && h.roundAt.CompareAndSwap(at, 0) {
			// Cleared before the round: a request arriving during it asks
			// for another.
			h.round(*h.roundWhy.Load())
		}
	}
}

// heartbeatLoop publishes a heartbeat for every subscriber connection each
// Heartbeat, and the "lost" message when this relay owes one.
func (h *Hub) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(h.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.beat(ctx)
	}
}

func (h *Hub) beat(ctx context.Context) {
	b := header(kindBeat, h.id)
	b = appendStamp(b, h.stamp())
	var out []outbound
	if s := h.sess.Load(); s != nil {
		for _, g := range s.groups {
			out = append(out, outbound{g.channels[0], b})
		}
	} else {
		out = append(out, outbound{h.channels[0], b}) // probes the publish path
	}
	// "lost" goes out with the heartbeat, after every publish it covers
	// failed or was skipped; other relays run one round for it.
	lost := h.owesLost.Swap(false)
	if lost {
		out = append(out, outbound{h.channels[0], header(kindLost, h.id)})
	}
	pctx, cancel := context.WithTimeout(ctx, h.cfg.PublishTimeout)
	defer cancel()
	if _, err := h.pipeline(pctx, out); err != nil {
		if ctx.Err() != nil {
			return
		}
		h.publishFailed(err) // owes "lost" again
	}
}

// session is one set of subscriber connections: one for a single node or
// Sentinel, one per master for a Cluster.
type session struct {
	groups []*group
	byNode map[*goredis.Client]*group // a Cluster's groups by master
	// confirmedAt is the stamp at which every channel was confirmed (0:
	// not yet).
	confirmedAt atomic.Int64
	left        atomic.Int32 // groups not yet confirmed
}

// heard returns the oldest, over the session's connections, of the newest own
// heartbeat each heard (its send stamp).
func (s *session) heard() int64 {
	m := int64(-1)
	for _, g := range s.groups {
		if v := g.heard.Load(); m < 0 || v < m {
			m = v
		}
	}
	return m
}

// fresh returns the stamp that health ages from: the last heartbeat heard on
// every connection, or the confirmation if later.
func (s *session) fresh() int64 { return max(s.heard(), s.confirmedAt.Load()) }

func (s *session) close() {
	for _, g := range s.groups {
		_ = g.ps.Close()
	}
}

type group struct {
	ps       *goredis.PubSub
	channels []string        // fleet channels (a heartbeat channel at least)
	pending  map[string]bool // channels sent at the start, not yet confirmed; receiver only
	heard    atomic.Int64
}

// subscribeLoop keeps one subscriber session open, replacing it with
// backoff whenever it fails.
func (h *Hub) subscribeLoop(ctx context.Context) {
	backoff := minBackoff
	for ctx.Err() == nil {
		s, err := h.open(ctx)
		if err == nil {
			h.sess.Store(s)
			err = h.run(ctx, s)
			h.sess.Store(nil)
			s.close()
			if s.confirmedAt.Load() != 0 {
				backoff = minBackoff
				if ctx.Err() == nil {
					h.m.reconnects.Inc()
				}
			}
		}
		if ctx.Err() != nil {
			return
		}
		if !h.ready.Load() && fatal(err) {
			// New gives up and closes the hub; until it does (or if it
			// has just stopped waiting), keep trying.
			h.firstOnce.Do(func() { h.first <- err })
		}
		h.log.Debug("redis subscriber session ended", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// open starts a session: it subscribes to the fleet channels and to every
// device still held; run reads their confirmations, and the session counts
// as confirmed once all are.
func (h *Hub) open(ctx context.Context) (*session, error) {
	s := &session{}
	if h.cluster == nil {
		ps := h.client.Subscribe(ctx)
		s.groups = []*group{{ps: ps, channels: h.channels}}
		if err := ps.Subscribe(ctx, h.channels...); err != nil {
			s.close()
			return nil, err
		}
	} else {
		if err := h.clusterGroups(ctx, s); err != nil {
			return nil, err
		}
		for _, g := range s.groups {
			// One SSUBSCRIBE per channel: a Cluster refuses one command
			// whose channels span slots (CROSSSLOT).
			for _, ch := range g.channels {
				if err := g.ps.SSubscribe(ctx, ch); err != nil {
					s.close()
					return nil, err
				}
			}
		}
	}
	for _, g := range s.groups {
		g.pending = make(map[string]bool, len(g.channels))
		for _, ch := range g.channels {
			g.pending[ch] = true
		}
	}
	devices := h.takeSubs(s, true)
	batches, err := h.batches(ctx, s, devices)
	if err == nil {
		for _, b := range batches {
			for _, ch := range b.chans {
				b.g.pending[ch] = true
			}
		}
		err = h.sendSubs(ctx, s, devices, true)
	}
	if err != nil {
		s.close()
		return nil, err
	}
	s.left.Store(int32(len(s.groups)))
	return s, nil
}

// clusterGroups opens one PubSub on each master, on a freshly loaded slot
// map, and gives each the fleet channels whose slot it owns, or a channel
// of its own for its heartbeats when it owns none.
func (h *Hub) clusterGroups(ctx context.Context, s *session) error {
	// ForEachMaster reloads the slot map before it returns; a stale map
	// would subscribe on a node that no longer owns the slot.
	var mu sync.Mutex
	s.byNode = map[*goredis.Client]*group{}
	err := h.cluster.ForEachMaster(ctx, func(_ context.Context, node *goredis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		s.byNode[node] = nil
		return nil
	})
	if err != nil {
		return err
	}
	add := func(node *goredis.Client, ch string) {
		g := s.byNode[node]
		if g == nil {
			g = &group{ps: node.SSubscribe(ctx)}
			s.byNode[node] = g
			s.groups = append(s.groups, g)
		}
		g.channels = append(g.channels, ch)
	}
	for _, ch := range h.channels {
		node, err := h.cluster.MasterForKey(ctx, ch)
		if err != nil {
			s.close()
			return err
		}
		add(node, ch)
	}
	// A master that owns no fleet channel still carries device channels,
	// and its connection needs a heartbeat: a channel of its own, found
	// by trying hash tags. A master that owns no slot gets no connection.
	lacking := 0
	for _, g := range s.byNode {
		if g == nil {
			lacking++
		}
	}
	for i := 0; lacking > 0 && i < 1<<16; i++ {
		ch := h.prefix + "beat{" + strconv.Itoa(i) + "}"
		node, err := h.cluster.MasterForKey(ctx, ch)
		if err != nil {
			s.close()
			return err
		}
		if g, ok := s.byNode[node]; ok && g == nil {
			add(node, ch)
			lacking--
		}
	}
	for node, g := range s.byNode {
		if g == nil {
			delete(s.byNode, node)
		}
	}
	return nil
}

// run reads the session until it fails: a connection error, a dropped
// subscription (a Cluster slot moved), confirmations or heartbeats that
// do not come, or ctx's end.
func (h *Hub) run(ctx context.Context, s *session) error {
	errc := make(chan error, len(s.groups))
	var wg sync.WaitGroup
	for _, g := range s.groups {
		wg.Go(func() { errc <- h.receive(ctx, s, g) })
	}
	defer wg.Wait()
	defer s.close() // unblocks the receivers
	silentFor := 3 * h.cfg.HeartbeatTimeout
	opened := h.stamp()
	t := time.NewTicker(h.cfg.Heartbeat)
	defer t.Stop()
	sweep := time.NewTicker(max(min(h.cfg.Linger/4, silentFor), time.Millisecond))
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			return err
		case <-h.subs.want:
			if err := h.subscribeMore(ctx, s); err != nil {
				return err
			}
			if err := h.leaveDisplaced(ctx, s); err != nil {
				return err
			}
			continue
		case <-sweep.C:
			if err := h.sweep(ctx, s); err != nil {
				return err
			}
			continue
		case <-t.C:
		}
		switch now := h.stamp(); {
		case s.confirmedAt.Load() == 0 && time.Duration(now-opened) > silentFor:
			return errors.New("wake: redis subscriptions not confirmed")
		case s.confirmedAt.Load() != 0 && time.Duration(now-s.fresh()) > silentFor:
			return errors.New("wake: own redis heartbeat not heard; replacing the subscriber")
		}
	}
}

func (h *Hub) receive(ctx context.Context, s *session, g *group) error {
	for {
		msg, err := g.ps.Receive(ctx)
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *goredis.Subscription:
			k, isDevice := h.deviceOf(m.Channel)
			switch m.Kind {
			case "subscribe", "ssubscribe":
				if isDevice {
					h.subscribed(s, k)
				}
				if !g.pending[m.Channel] {
					if !isDevice && s.confirmedAt.Load() != 0 {
						// go-redis subscribed again by itself (it replaces
						// a connection it finds unusable): messages of the
						// gap may be lost.
						h.requestRound(roundResubscribed, h.stamp())
					}
					continue
				}
				delete(g.pending, m.Channel)
				if len(g.pending) == 0 && s.left.Add(-1) == 0 {
					h.confirmed(s)
				}
			case "unsubscribe", "sunsubscribe":
				if !isDevice || !h.unsubscribed(s, k) {
					return fmt.Errorf("wake: redis dropped the subscription to %s", m.Channel)
				}
			}
		case *goredis.Message:
			h.handle(s, g, m.Payload)
		}
	}
}

// confirmed: every channel of s is subscribed. Wakes published from now on
// arrive; those published before, while no session listened, may be lost,
// so a session that is not the first runs a round.
func (h *Hub) confirmed(s *session) {
	s.confirmedAt.Store(h.stamp())
	if h.ready.Load() {
		h.requestRound(roundResubscribed, h.stamp())
	}
	h.firstOnce.Do(func() { h.first <- nil })
}

// handle acts on one message: the observer first, then the waiter.
func (h *Hub) handle(s *session, g *group, payload string) {
	m, err := parse(payload)
	if err != nil {
		return
	}
	if m.from == h.id {
		if m.kind == kindBeat {
			if v, err := m.nextInt(); err == nil {
				g.heard.Store(v)
				// Every connection heard a heartbeat sent after the last
				// failure: the breaker closes, and stays closed through
				// later sessions until the next failure.
				if at := h.pubErrAt.Load(); at != 0 && s.heard() > at {
					h.pubErrAt.CompareAndSwap(at, 0)
				}
			}
		}
		return // our own wakes were applied locally before publishing
	}
	switch m.kind {
	case kindWakes:
		for !m.empty() {
			w, err := m.nextWake()
			if err != nil {
				return
			}
			if obs := h.local.Observer(); obs != nil {
				obs.Advanced(w)
			}
			if !h.local.Notify(w.Key) {
				h.m.unheld.Inc()
				if p := h.local.Pusher(); p != nil && !w.Push.Empty() && h.pushes(w.Key) {
					p.Push(w.Key, w.Push)
				}
			}
			h.m.received.Inc()
		}
	case kindPresence:
		k, err := m.nextKey()
		if err != nil {
			return
		}
		since, err := m.nextInt()
		if err != nil {
			return
		}
		h.heldElsewhere(k, since)
	case kindRemoval:
		k, err := m.nextKey()
		if err != nil {
			return
		}
		at, err := m.nextInt()
		if err != nil {
			return
		}
		if obs := h.local.Observer(); obs != nil {
			obs.Removed(k, time.Unix(0, at))
		}
		h.local.End(k, wake.ErrRemoved)
	case kindLost:
		// At most one round per FallbackInterval for these: after an
		// outage every relay says it, at about the same time.
		h.requestRound(roundPeer, max(h.stamp(), h.lastRound.Load()+int64(h.cfg.FallbackInterval)))
	}
}
