package redis

import (
	"context"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/wake"
	"github.com/flamenet/relay/wake/local"
)

// Device subscriptions. A device's wakes travel on a channel of its own,
// and a relay listens only on the channels of the devices it holds a poll
// or stream of: Redis delivers each wake to the relays that can use it,
// not to every relay of the fleet.
//
// A relay subscribes when it registers a device's first waiter, and the
// waiter is handed out only once Redis confirmed the subscription (or
// SubscribeTimeout passed, and the waiter is woken when it is confirmed),
// so a send committed after the poll's first read reaches it. The
// subscription outlives its last waiter by Linger: a device that polls
// again within it costs Redis nothing, however often it polls. New
// subscriptions are sent in batches, one command for all that are waiting
// on a single Redis, one per hash tag on a Cluster, where a command's
// channels must share a slot.
//
// Channels are prefix + "d:{tag}household/device", the tag one of
// tagCount by a hash of the device (the Cluster slot of its channel).
//
// Presence: a relay whose subscription to a device is new announces on
// the device's channel since when it holds the device ('P'). A relay that
// held the device before ends its poll as superseded, as a newer poll on
// one relay supersedes an older, and leaves the channel at once rather
// than after the linger: one poll per device in the fleet, and the
// device's wakes reach the relay it moved to. A relay whose own poll of
// the device is the newer (the device came back before the news arrived)
// announces again. Clocks of relays that differ by more than the moment
// between two polls of a device on two relays could end the newer.
//
// Pushes: a send's relay pushes a device it does not hold only when no
// other relay listens for it (PUBLISH's count); a relay that listens,
// does not hold the device and was not displaced from it pushes it when
// the wake arrives (the wake carries the target). A device is so pushed
// by one relay, and not while a relay holds it, except in the moment
// between its first poll on a new relay and the old relay hearing of it
// (one delivery through Redis).

// tagCount is the number of hash tags of device channels: the most SSUBSCRIBE
// commands one batch needs on a Cluster.
const tagCount = 1024

// subCommandMax bounds the channels of one SUBSCRIBE or UNSUBSCRIBE.
const subCommandMax = 1000

type subState uint8

const (
	subWanted    subState = iota // to be sent by the session
	subSent                      // SUBSCRIBE sent on sess, not yet confirmed
	subConfirmed                 // confirmed on sess: the device's wakes reach this relay
	subLeaving                   // UNSUBSCRIBE sent on sess
)

// sub is one device's subscription.
type sub struct {
	state   subState
	sess    *session // the session it was sent on
	holders int      // waiters registered and not yet closed
	idleAt  int64    // stamp at which holders fell to 0
	sentAt  int64    // stamp at which it was sent
	again   bool     // held again while leaving: subscribe once it has left
	late    bool     // a holder stopped waiting for the confirmation: wake it then
	ready   chan struct{}

	heldAt    int64 // wall clock (unix nanos) of the latest hold: presence
	announce  bool  // new here: announce presence at the confirmation
	displaced bool  // another relay holds the device since: leave at once
}

type subShard struct {
	mu sync.Mutex
	m  map[device.Key]*sub
}

// subs is a relay's device subscriptions.
type subs struct {
	seed   maphash.Seed
	shards [64]subShard
	want   chan struct{} // a sub is wanted, or one is to leave: the session sends it
	count  atomic.Int64  // subscriptions, in any state

	leaveMu sync.Mutex
	leave   []device.Key // displaced and no longer held: leave now
}

func newSubs() *subs {
	s := &subs{seed: maphash.MakeSeed(), want: make(chan struct{}, 1)}
	for i := range s.shards {
		s.shards[i].m = make(map[device.Key]*sub)
	}
	return s
}

func (s *subs) shard(k device.Key) *subShard {
	return &s.shards[k.Hash(s.seed)&uint64(len(s.shards)-1)]
}

func (s *subs) wanted() {
	select {
	case s.want <- struct{}{}:
	default:
	}
}

// each calls fn for every sub, shard by shard, under the shard's lock.
func (s *subs) each(fn func(k device.Key, v *sub, sh *subShard)) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, v := range sh.m {
			fn(k, v, sh)
		}
		sh.mu.Unlock()
	}
}

// DeviceChannel returns the channel that carries k's wakes.
func (h *Hub) DeviceChannel(k device.Key) string {
	return h.devicePrefix + "{" + strconv.Itoa(shardOf(k, tagCount)) + "}" + k.Household + "/" + k.Device
}

// deviceOf returns the device whose channel ch is.
func (h *Hub) deviceOf(ch string) (device.Key, bool) {
	rest, ok := strings.CutPrefix(ch, h.devicePrefix)
	if !ok {
		return device.Key{}, false
	}
	_, rest, ok = strings.Cut(rest, "}")
	if !ok {
		return device.Key{}, false
	}
	// Names hold no '/': the last one separates them.
	i := strings.LastIndexByte(rest, '/')
	if i < 0 {
		return device.Key{}, false
	}
	return device.KeyOf(rest[:i], rest[i+1:]), true
}

// Subscribe registers k's one waiter on this process, superseding an older
// one here, and subscribes to k's channel unless this relay is subscribed
// already. It returns once Redis confirmed the subscription, or after
// SubscribeTimeout (or ctx's end, or at once while no subscriber session is
// confirmed): the waiter is then woken when the subscription is confirmed,
// so that its poll reads the store again. After Close it returns nil and
// wake.ErrClosed.
func (h *Hub) Subscribe(ctx context.Context, k device.Key) (wake.Waiter, error) {
	w, err := h.local.SubscribeLocal(k)
	if err != nil {
		return nil, err
	}
	// Registered first, subscribed second: a wake that arrives once the
	// subscription is confirmed finds the waiter.
	h.hold(ctx, k)
	return &waiter{Waiter: w, h: h}, nil
}

// waiter is a local waiter that lets its device's subscription go when it
// is closed.
type waiter struct {
	*local.Waiter
	h    *Hub
	once sync.Once
}

func (w *waiter) Close() {
	w.Waiter.Close()
	w.once.Do(func() { w.h.release(w.Key()) })
}

// hold adds a holder to k's subscription, subscribing if there is none, and
// waits for its confirmation (see Subscribe).
func (h *Hub) hold(ctx context.Context, k device.Key) {
	sh := h.subs.shard(k)
	sh.mu.Lock()
	v := sh.m[k]
	if v == nil {
		v = &sub{ready: make(chan struct{}), announce: true}
		sh.m[k] = v
		h.subs.count.Add(1)
		h.subs.wanted()
	} else if v.state == subLeaving {
		v.again, v.announce = true, true
	}
	v.holders++
	v.heldAt = time.Now().UnixNano()
	cur := h.sess.Load()
	if v.displaced {
		// Back from the relay that displaced this one: say so.
		v.displaced = false
		if v.state == subConfirmed && v.sess == cur {
			h.announceLocked(k, v)
		} else {
			v.announce = true
		}
	}
	if v.state == subConfirmed && v.sess == cur {
		sh.mu.Unlock()
		return
	}
	ready := v.ready
	if cur == nil || cur.confirmedAt.Load() == 0 {
		// Nothing to confirm it soon: the hub runs fallback rounds while
		// it has no session, and the new session's confirmation wakes the
		// poll.
		v.late = true
		sh.mu.Unlock()
		return
	}
	sh.mu.Unlock()
	if h.hooks.holdWaits != nil {
		h.hooks.holdWaits(k)
	}
	t := time.NewTimer(h.cfg.SubscribeTimeout)
	defer t.Stop()
	select {
	case <-ready:
		return
	case <-t.C:
	case <-ctx.Done():
	}
	sh.mu.Lock()
	if v.state != subConfirmed {
		v.late = true
	}
	sh.mu.Unlock()
}

// release removes a holder from k's subscription; the last starts its
// linger.
func (h *Hub) release(k device.Key) {
	sh := h.subs.shard(k)
	sh.mu.Lock()
	v := sh.m[k]
	leave := false
	if v != nil {
		v.holders--
		if v.holders == 0 {
			v.idleAt = h.stamp()
			leave = v.displaced
		}
	}
	sh.mu.Unlock()
	if leave {
		h.leaveSoon(k)
	}
}

// leaveSoon has the session leave k's channel now, not after the linger.
func (h *Hub) leaveSoon(k device.Key) {
	h.subs.leaveMu.Lock()
	h.subs.leave = append(h.subs.leave, k)
	h.subs.leaveMu.Unlock()
	h.subs.wanted()
}

// leaveDisplaced leaves the channels of displaced devices no longer held.
func (h *Hub) leaveDisplaced(ctx context.Context, s *session) error {
	h.subs.leaveMu.Lock()
	keys := h.subs.leave
	h.subs.leave = nil
	h.subs.leaveMu.Unlock()
	var chans []string
	for _, k := range keys {
		sh := h.subs.shard(k)
		sh.mu.Lock()
		if v := sh.m[k]; v != nil && v.displaced && v.holders == 0 && v.state == subConfirmed && v.sess == s {
			v.state = subLeaving
			chans = append(chans, h.DeviceChannel(k))
		}
		sh.mu.Unlock()
	}
	if len(chans) == 0 {
		return nil
	}
	return h.sendSubs(ctx, s, chans, false)
}

// listens reports whether this relay's subscription to k may be in force
// at Redis: sent, confirmed or leaving.
func (h *Hub) listens(k device.Key) int64 {
	sh := h.subs.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if v := sh.m[k]; v != nil && v.state != subWanted {
		return 1
	}
	return 0
}

// pushes reports whether this relay pushes k, which it does not hold, when
// another relay's wake of it arrives: it listens for k and no other relay
// took k from it.
func (h *Hub) pushes(k device.Key) bool {
	sh := h.subs.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	v := sh.m[k]
	return v != nil && v.state == subConfirmed && !v.displaced
}

// presence is a relay's word that it holds a device since a time.
type presence struct {
	k     device.Key
	since int64 // unix nanos
}

// announceQueue bounds the presences waiting to be published; past it they
// are dropped, and a displaced poll answers when its wait ends.
const announceQueue = 4096

// announceLocked queues k's presence; sh.mu is held.
func (h *Hub) announceLocked(k device.Key, v *sub) {
	v.announce = false
	select {
	case h.announce <- presence{k, v.heldAt}:
	default:
	}
}

// announceLoop publishes queued presences, in one pipeline per batch.
func (h *Hub) announceLoop(ctx context.Context) {
	for {
		var batch []outbound
		select {
		case <-ctx.Done():
			return
		case p := <-h.announce:
			batch = append(batch, h.presenceOut(p))
		}
		for len(batch) < subCommandMax {
			select {
			case p := <-h.announce:
				batch = append(batch, h.presenceOut(p))
				continue
			default:
			}
			break
		}
		_, _ = h.publish(ctx, batch) // a failure opens the breaker and owes "lost"
	}
}

func (h *Hub) presenceOut(p presence) outbound {
	return outbound{h.DeviceChannel(p.k), appendPresence(header(kindPresence, h.id), p.k, p.since)}
}

// heldElsewhere: another relay holds k since the time given. A poll held
// here that began before ends as superseded, and this relay leaves k's
// channel once none is held; if the device was here after, this relay
// says so in turn.
func (h *Hub) heldElsewhere(k device.Key, since int64) {
	sh := h.subs.shard(k)
	sh.mu.Lock()
	v := sh.m[k]
	if v == nil || v.state != subConfirmed {
		sh.mu.Unlock()
		return
	}
	if v.heldAt > since {
		// The device came here after: the other relay holds a poll its
		// device left, or a message came late.
		h.announceLocked(k, v)
		sh.mu.Unlock()
		return
	}
	moved := !v.displaced // a relay may say so twice (see above)
	v.displaced = true
	held := v.holders > 0
	sh.mu.Unlock()
	if moved {
		h.m.displaced.Inc()
	}
	if held {
		// Its poll closes its waiter, and the last close leaves.
		h.local.End(k, wake.ErrSuperseded)
		return
	}
	h.leaveSoon(k)
}

// Hears reports whether k's subscription is confirmed on the current
// session: every wake for k reaches this relay.
func (h *Hub) Hears(k device.Key) bool {
	cur := h.sess.Load()
	if cur == nil {
		return false
	}
	sh := h.subs.shard(k)
	sh.mu.Lock()
	v := sh.m[k]
	ok := v != nil && v.state == subConfirmed && v.sess == cur
	sh.mu.Unlock()
	return ok
}

// takeSubs marks every wanted sub as sent on s, and returns their channels:
// for a new session, every sub still held (what a session that ended had
// confirmed or sent is sent again); later, only the wanted ones.
func (h *Hub) takeSubs(s *session, all bool) []string {
	var chans []string
	now := h.stamp()
	h.subs.each(func(k device.Key, v *sub, sh *subShard) {
		if all && v.sess != s {
			switch v.state {
			case subLeaving:
				if v.holders == 0 && !v.again {
					delete(sh.m, k)
					h.subs.count.Add(-1)
					return
				}
				v.again = false
			case subConfirmed:
				v.ready = make(chan struct{}) // the old one is closed
			}
			v.state = subWanted
		}
		if v.state != subWanted {
			return
		}
		v.state, v.sess, v.sentAt = subSent, s, now
		chans = append(chans, h.DeviceChannel(k))
	})
	return chans
}

// subscribeMore sends the subscriptions wanted since the session opened.
func (h *Hub) subscribeMore(ctx context.Context, s *session) error {
	if h.hooks.beforeSubscribe != nil {
		h.hooks.beforeSubscribe()
	}
	chans := h.takeSubs(s, false)
	if len(chans) == 0 {
		return nil
	}
	return h.sendSubs(ctx, s, chans, true)
}

// sendSubs sends SUBSCRIBE (subscribe) or UNSUBSCRIBE for device channels
// on s: in commands of up to subCommandMax channels on a single Redis; on a
// Cluster, on the connection to each channel's master, one command per
// hash tag.
func (h *Hub) sendSubs(ctx context.Context, s *session, chans []string, subscribe bool) error {
	op := "unsubscribe"
	if subscribe {
		op = "subscribe"
	}
	h.m.subChanges.WithLabelValues(op).Add(float64(len(chans)))
	batches, err := h.batches(ctx, s, chans)
	if err != nil {
		return err
	}
	for _, b := range batches {
		for len(b.chans) > 0 {
			n := min(len(b.chans), subCommandMax)
			var err error
			switch {
			case h.cluster != nil && subscribe:
				err = b.g.ps.SSubscribe(ctx, b.chans[:n]...)
			case h.cluster != nil:
				err = b.g.ps.SUnsubscribe(ctx, b.chans[:n]...)
			case subscribe:
				err = b.g.ps.Subscribe(ctx, b.chans[:n]...)
			default:
				err = b.g.ps.Unsubscribe(ctx, b.chans[:n]...)
			}
			h.m.subCommands.WithLabelValues(op).Inc()
			if err != nil {
				return fmt.Errorf("wake: redis %s: %w", op, err)
			}
			b.chans = b.chans[n:]
		}
	}
	return nil
}

type batch struct {
	g     *group
	chans []string
}

// batches splits chans by the connection and command that carry them.
func (h *Hub) batches(ctx context.Context, s *session, chans []string) ([]batch, error) {
	if h.cluster == nil {
		return []batch{{s.groups[0], chans}}, nil
	}
	byTag := map[string]*batch{}
	var out []*batch
	for _, ch := range chans {
		tag := ch[:strings.IndexByte(ch, '}')]
		b := byTag[tag]
		if b == nil {
			node, err := h.cluster.MasterForKey(ctx, ch)
			if err != nil {
				return nil, err
			}
			g := s.byNode[node]
			if g == nil {
				// A master this session has no connection to: the slots
				// moved. A new session connects to every master.
				return nil, fmt.Errorf("wake: redis: no subscriber connection to the master of %s", ch)
			}
			b = &batch{g: g}
			byTag[tag] = b
			out = append(out, b)
		}
		b.chans = append(b.chans, ch)
	}
	res := make([]batch, len(out))
	for i, b := range out {
		res[i] = *b
	}
	return res, nil
}

// sweep unsubscribes from the devices that no waiter held for Linger, and
// fails the session when a subscription stays unconfirmed for too long.
func (h *Hub) sweep(ctx context.Context, s *session) error {
	now := h.stamp()
	linger := int64(h.cfg.Linger)
	stuck := int64(3 * h.cfg.HeartbeatTimeout)
	var leave []string
	var unconfirmed int
	h.subs.each(func(k device.Key, v *sub, sh *subShard) {
		switch {
		case v.holders > 0:
			if v.state == subSent && v.sess == s && now-v.sentAt > stuck {
				unconfirmed++
			}
		case now-v.idleAt <= linger:
		case v.state == subWanted:
			delete(sh.m, k)
			h.subs.count.Add(-1)
		case v.state == subConfirmed && v.sess == s:
			v.state = subLeaving
			leave = append(leave, h.DeviceChannel(k))
		}
	})
	if unconfirmed > 0 {
		return fmt.Errorf("wake: redis: %d device subscriptions not confirmed", unconfirmed)
	}
	if len(leave) == 0 {
		return nil
	}
	return h.sendSubs(ctx, s, leave, false)
}

// subscribed: Redis confirmed k's subscription on s. What memory learned of
// k before is forgotten (it may have missed wakes), and a holder that
// stopped waiting is woken, to read the store again.
func (h *Hub) subscribed(s *session, k device.Key) {
	sh := h.subs.shard(k)
	sh.mu.Lock()
	v := sh.m[k]
	if v == nil || v.sess != s || v.state != subSent {
		again := v != nil && v.sess == s && v.state == subConfirmed
		sh.mu.Unlock()
		if again {
			// go-redis subscribed again by itself (it replaced a
			// connection): wakes of the gap may be lost.
			h.requestRound(roundResubscribed, h.stamp())
		}
		return
	}
	// Forgotten before the subscription counts as heard (Hears), under
	// the lock Hears takes: a read of the store that begins from now on
	// sees every send whose wake came before the confirmation.
	if obs := h.local.Observer(); obs != nil {
		obs.Forget(k)
	}
	if v.announce {
		h.announceLocked(k, v)
	}
	v.state = subConfirmed
	late := v.late
	v.late = false
	close(v.ready)
	sh.mu.Unlock()
	if late {
		h.local.Notify(k)
	}
}

// unsubscribed: Redis confirmed that s no longer listens on k's channel.
// It reports false for a subscription Redis dropped unasked (a Cluster
// slot that moved): the session must end.
func (h *Hub) unsubscribed(s *session, k device.Key) bool {
	sh := h.subs.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	v := sh.m[k]
	if v == nil || v.sess != s || v.state != subLeaving {
		return v == nil || v.sess != s
	}
	if v.holders > 0 || v.again {
		v.state, v.again, v.displaced, v.ready = subWanted, false, false, make(chan struct{})
		h.subs.wanted()
		return true
	}
	delete(sh.m, k)
	h.subs.count.Add(-1)
	return true
}

// hooks let tests hold the hub at chosen points.
type hooks struct {
	beforeSubscribe func()             // the session is about to send wanted subscriptions
	holdWaits       func(k device.Key) // a holder waits for its confirmation
}

var _ wake.Watcher = (*waiter)(nil)
