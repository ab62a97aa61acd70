// Package driver offers a run's load to the relays as clients would: it
// registers each pair's recipient, sends from each pair's sender when the
// schedule says, holds each recipient's polls or stream, acknowledges what
// arrives, and retries as a careful client does. Every answer goes to the
// tally; the driver keeps only what its clients need to go on.
package driver

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/loadtest/internal/check"
	"github.com/flamenet/relay/loadtest/internal/tally"
	"github.com/flamenet/relay/token"
)

// Config is the load a driver offers.
type Config struct {
	Targets []string           // the relays' base URLs
	Key     ed25519.PrivateKey // the issuer the relays trust
	Tag     string             // the run's, in its households' names
	Pairs   int
	Wait    int    // poll wait, seconds
	Payload int    // bytes a send carries
	Codec   string // json or msgpack
	// Explicit: recipients acknowledge with POST /v1/ack and poll without
	// a cursor (-ack explicit).
	Explicit    bool
	Stream      bool // recipients hold streams, not polls
	SourceAddrs int  // loopback source addresses the connections are spread over
	// Careful: a send that got no definitive answer goes again with the
	// same id, so that one the relay committed just before it died is
	// answered, not left in doubt (-crash, -faults, -failover).
	Careful bool
	Expires time.Time // the tokens'
	// Seed, a fault campaign's, draws the order of the sends, so that a
	// replay offers the same sends to the same pairs at the same times;
	// with one, a recipient's client can be crashed ([Driver.ArmCrash]). Nil: no
	// campaign.
	Seed *uint64
	// Removals judge what the relays accept of a life a removal may have
	// ended; nil without a campaign.
	Removals Removals
	// Hop is the chance (0 to 1) that a recipient's next poll or stream
	// goes to another relay, drawn at random, than its last (-hop); above
	// 0 each send, too, goes to a relay drawn at random.
	Hop float64
}

// Removals judge a request of a recipient's life that the relay accepted,
// when a campaign may have removed that life.
type Removals interface {
	// Accepted is told that relay accepted op of life li of pair (whose
	// recipient is the device named), sent at asked.
	Accepted(pair, li int, recipient, op string, relay int, asked time.Time)
}

// seedOrder is the stream of a campaign's seed that draws the order of
// the sends, apart from the plan's; seedHops and seedSends draw the
// relays of the recipients' holds and of the sends when they hop.
const (
	seedOrder = 0x6f726472 // "ordr"
	seedHops  = 0x686f7073 // "hops"
	seedSends = 0x73656e64 // "send"
)

// Driver offers one run's load.
type Driver struct {
	cfg   Config
	tally *tally.Tally
	tr    *http.Transport
	// opts are the clients' options.
	opts  []client.Option
	pairs []*pair
	order []int // pair of send i is order[i % len(order)]
	// giveUp ends a careful sender's retries: the end of the drain.
	giveUp time.Time

	// mu guards each pair's lives and nextLife.
	mu sync.Mutex
}

type pair struct {
	idx       int
	household string
	sender    string
	recipient string
	senderTok string
	// sendClients speak as the sender, one to each relay (by its index
	// among the targets). Without hopping every send goes to sendRelay.
	sendClients []*client.Client
	sendRelay   int
	// home is the relay the recipient polls first, and every time
	// without hopping.
	home int

	// lives are the recipient's registrations, as its client knows them,
	// oldest first: a campaign's removal ends one, and a registration
	// with a fresh token begins the next (the tally keeps when each
	// lasted). Without -faults there is one. Guarded by the driver's mu.
	lives []*life
	// nextLife is closed when a life begins; guarded by mu.
	nextLife chan struct{}
	// crash arms a client crash, the value its down time; nil without
	// -faults.
	crash chan time.Duration

	// Owned by the recipient's goroutine while the run lasts.
	cursor int64
	// epoch is the store epoch of cursor ("" until a relay named one).
	epoch string
	// polled is the life the cursor belongs to; lostPlace, that a crash
	// lost it and the next poll asks the relay.
	polled    int
	lostPlace bool
	// resync: a 409 cursor_ahead refused the cursor and epoch, and the
	// next poll leaves both out; resyncs counts those 409s.
	resync  bool
	resyncs int
	// pollRelay is the relay of the recipient's latest poll or stream,
	// where that hold's every request goes (its acks too); hops draws
	// the next.
	pollRelay int
	hops      *mrand.Rand
}

// life is how the recipient's client speaks in one of its lives.
type life struct {
	idx   int // among the recipient's lives
	token string
	// clients speak with token, one to each relay, made as the recipient
	// first holds there; only the recipient's goroutine touches them
	// once the life has begun.
	clients []*client.Client
	cursor  int64  // where its registration put the cursor
	epoch   string // and in which store epoch
	// ctx ends when the next life begins, and with it the old token's
	// polls.
	ctx context.Context
	end context.CancelFunc
}

// newLife returns life idx of a recipient on n relays, with c speaking
// to relay home.
func newLife(idx int, token string, n, home int, c *client.Client) *life {
	l := &life{idx: idx, token: token, clients: make([]*client.Client, n)}
	l.clients[home] = c
	l.ctx, l.end = context.WithCancel(context.Background())
	return l
}

// requestTimeout bounds the load's every request. Never shorter than a
// held poll plus slack: a client timeout that cuts a held poll would be
// counted against the relay. With it set, the client package adds no
// shorter bound of its own. None with streams: a stream is one request
// for minutes, which a Timeout would cut; the client package then bounds
// every other request itself, and a stream by its silence.
func requestTimeout(stream bool, wait int) time.Duration {
	if stream {
		return 0
	}
	return time.Duration(wait+30) * time.Second
}

// sendLimit bounds the sends in flight: only to keep the tester alive.
func sendLimit(pairs int) int { return max(1024, pairs+64) }

// New returns a driver of cfg's pairs, each with a client for its sender
// and one for its recipient's first life, and adds each pair to t.
func New(cfg Config, t *tally.Tally) (*Driver, error) {
	tr := newTransport(cfg.Pairs+sendLimit(cfg.Pairs)+64, cfg.SourceAddrs)
	hc := &http.Client{Transport: tr, Timeout: requestTimeout(cfg.Stream, cfg.Wait)}
	d := &Driver{
		cfg:   cfg,
		tally: t,
		tr:    tr,
		// One client per token, all on hc: a client is a few fields, the
		// connections are hc's.
		opts: []client.Option{client.WithHTTPClient(hc), client.WithCodec(codec(cfg.Codec))},
	}
	// Each pair is a household of its own, two devices, as a family's
	// phone and laptop would be: a relay's per-household limits then see
	// what they would see in the field, not one household sending
	// everything.
	households := "lt-" + time.Now().UTC().Format("20060102T150405") + "-" + cfg.Tag + "-"
	n := len(cfg.Targets)
	for k := range cfg.Pairs {
		p := &pair{
			idx:       k,
			sender:    "s" + strconv.Itoa(k),
			recipient: "r" + strconv.Itoa(k),
			// With several relays and no hopping the sender sits on
			// another relay than its recipient, so every wake-up crosses
			// replicas.
			home:      k % n,
			pollRelay: k % n,
			sendRelay: (k + 1) % n,
			hops:      mrand.New(hopSource(cfg.Seed, uint64(k))),
		}
		p.household = households + strconv.Itoa(k)
		p.senderTok = d.Mint(p.household, p.sender, token.ScopeDevice, time.Now())
		p.sendClients = make([]*client.Client, n)
		for i := range n {
			// Without hopping the pair's own relay is all it sends to.
			if i != p.sendRelay && cfg.Hop <= 0 {
				continue
			}
			var err error
			if p.sendClients[i], err = client.New(cfg.Targets[i], p.senderTok, d.opts...); err != nil {
				return nil, err
			}
		}
		tok := d.Mint(p.household, p.recipient, token.ScopeDevice, time.Now())
		c, err := client.New(cfg.Targets[p.home], tok, d.opts...)
		if err != nil {
			return nil, err
		}
		p.lives = []*life{newLife(0, tok, n, p.home, c)}
		p.nextLife = make(chan struct{})
		t.AddPair(p.sender, p.recipient)
		d.pairs = append(d.pairs, p)
	}
	d.order = mrand.Perm(cfg.Pairs)
	if cfg.Seed != nil {
		// The campaign's seed picks the order too, so that a replay
		// offers the same sends to the same pairs at the same times.
		d.order = mrand.New(mrand.NewPCG(*cfg.Seed, seedOrder)).Perm(cfg.Pairs)
		for _, p := range d.pairs {
			p.crash = make(chan time.Duration, 1)
		}
	}
	return d, nil
}

// PairOf returns the pair send i goes from.
func (d *Driver) PairOf(i int) int { return d.order[i%len(d.order)] }

// hopSource is what draws pair k's hops: from a campaign's seed, so that
// a replay draws the same relays in the same order, or at random.
func hopSource(seed *uint64, k uint64) mrand.Source {
	if seed != nil {
		return mrand.NewPCG(*seed^seedHops, k)
	}
	return mrand.NewPCG(mrand.Uint64(), k)
}

// nextRelay returns the relay of a recipient's next hold, which last held
// on relay cur of n: with chance hop another, drawn by rng, else cur.
func nextRelay(rng *mrand.Rand, cur, n int, hop float64) int {
	if n < 2 || hop <= 0 || rng.Float64() >= hop {
		return cur
	}
	next := rng.IntN(n - 1)
	if next >= cur {
		next++ // any relay but cur, each as likely
	}
	return next
}

// sendRelayOf returns the relay send i of p goes to: p's own without
// hopping, else one drawn at random (from a campaign's seed by i, so that
// a replay sends on the same relays).
func (d *Driver) sendRelayOf(p *pair, i int) int {
	n := len(d.cfg.Targets)
	switch {
	case d.cfg.Hop <= 0 || n < 2:
		return p.sendRelay
	case d.cfg.Seed != nil:
		return mrand.New(mrand.NewPCG(*d.cfg.Seed^seedSends, uint64(i))).IntN(n)
	default:
		return mrand.IntN(n)
	}
}

// clientOf returns life l's client of relay i, made on first use. Only
// the recipient's goroutine calls it.
func (d *Driver) clientOf(l *life, i int) *client.Client {
	if l.clients[i] == nil {
		c, err := d.Client(i, l.token)
		if err != nil {
			// New made a client of every target already (the senders',
			// when recipients hop), so target and token are good.
			panic(err)
		}
		l.clients[i] = c
	}
	return l.clients[i]
}

// SetGiveUp sets when a careful sender stops retrying: the end of the
// drain. It must be called before the sends begin.
func (d *Driver) SetGiveUp(t time.Time) { d.giveUp = t }

// GiveUp returns when a careful client stops retrying.
func (d *Driver) GiveUp() time.Time { return d.giveUp }

// Mint issues a token of the run's issuer.
func (d *Driver) Mint(household, device, scope string, issued time.Time) string {
	tok, err := token.Mint(d.cfg.Key, token.Claims{
		Household: household, Device: device, Expires: d.cfg.Expires,
		IssuedAt: issued, Scope: scope,
	})
	if err != nil {
		panic(err) // only on empty claims, which cannot happen here
	}
	return tok
}

// Client returns a client of the load's that speaks to relay i with tok.
func (d *Driver) Client(i int, tok string) (*client.Client, error) {
	return client.New(d.cfg.Targets[i], tok, d.opts...)
}

// Call makes one request the client package has no call for (an admin's
// removal, the directory) to relay i, on the load's connections.
func (d *Driver) Call(ctx context.Context, i int, method, path, tok string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, d.cfg.Targets[i]+path, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := d.tr.RoundTrip(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body, err
}

// Pair returns pair i's household, its recipient's device, and the relay
// the recipient polls first (with hopping it moves on from there): the
// client [Driver.Begin] is given speaks to that one.
func (d *Driver) Pair(i int) (household, recipient string, pollRelay int) {
	p := d.pairs[i]
	return p.household, p.recipient, p.home
}

// Token returns the token of life li of pair's recipient.
func (d *Driver) Token(pair, li int) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pairs[pair].lives[li].token
}

// ArmCrash crashes pair's recipient's client the next time it receives
// envelopes, for down; nothing if a crash is armed already.
func (d *Driver) ArmCrash(pair int, down time.Duration) {
	select {
	case d.pairs[pair].crash <- down:
	default: // one is armed already
	}
}

// Begin begins pair's recipient's next life, l, registered already with
// tok (at cursor, in epoch); c polls with it, at the relay [Driver.Pair]
// names. The life before ends, and with it the old token's polls.
func (d *Driver) Begin(pair int, l *check.Life, tok string, c *client.Client, cursor int64, epoch string) {
	d.tally.BeginLife(pair, l)
	p := d.pairs[pair]
	d.mu.Lock()
	old := p.lives[len(p.lives)-1]
	nl := newLife(len(p.lives), tok, len(d.cfg.Targets), p.home, c)
	nl.cursor, nl.epoch = cursor, epoch
	p.lives = append(p.lives, nl)
	close(p.nextLife)
	p.nextLife = make(chan struct{})
	d.mu.Unlock()
	old.end()
}

// current returns the recipient's latest life.
func (d *Driver) current(p *pair) *life {
	d.mu.Lock()
	defer d.mu.Unlock()
	return p.lives[len(p.lives)-1]
}

// awaitLife waits until a life after li begins, or ctx ends.
func (d *Driver) awaitLife(ctx context.Context, p *pair, li int) {
	d.mu.Lock()
	next, begun := p.nextLife, len(p.lives)-1 > li
	d.mu.Unlock()
	if begun {
		return
	}
	select {
	case <-next:
	case <-ctx.Done():
	}
}

// Close ends every life, and with it whatever still polls, and closes the
// load's idle connections. It may be called again.
func (d *Driver) Close() {
	d.mu.Lock()
	for _, p := range d.pairs {
		for _, l := range p.lives {
			l.end()
		}
	}
	d.mu.Unlock()
	d.tr.CloseIdleConnections()
}
