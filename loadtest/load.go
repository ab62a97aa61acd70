package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/internal/backoff"
	"github.com/flamenet/relay/internal/fdlimit"
	"github.com/flamenet/relay/loadtest/report"
	"github.com/flamenet/relay/token"
)

// load runs one scenario end to end: the stack (unless -url), the run, the
// checks, the report.
func load(ctx context.Context, cfg *config, stdout, stderr io.Writer) (err error) {
	logger := slog.New(slog.NewTextHandler(stderr, nil)).With("component", "loadtest")
	if err := cfg.checkTargets(ctx); err != nil {
		return err
	}
	need := fileNeed(cfg)
	soft, _, limErr := fdlimit.RaiseTo(need)
	if limErr != nil {
		logger.Warn("cannot raise the open-file limit", "err", limErr)
	}
	// One connection per held poll, plus sends in flight and slack.
	if soft < need {
		logger.Warn("open-file limit is below what this run needs", "limit", soft, "need", need)
	}

	src := cfg.src
	if src == "" {
		src, err = findModuleRoot(ctx, ".")
		if err != nil && len(cfg.urls) == 0 && cfg.relayBin == "" {
			return err
		}
	}

	rep := &report.Report{
		Name:     cfg.name,
		Command:  cfg.command,
		Git:      gitState(ctx, src),
		Go:       runtime.Version(),
		Machine:  machine(),
		Store:    cfg.store,
		Replicas: cfg.replicas,
		Config: report.Config{
			Target:           "throwaway",
			Pairs:            cfg.pairs,
			Rate:             cfg.rate,
			DurationSeconds:  cfg.duration.Seconds(),
			WaitSeconds:      cfg.wait,
			PayloadBytes:     cfg.payload,
			Codec:            cfg.codec,
			Herd:             cfg.herd,
			DrainSeconds:     cfg.drain.Seconds(),
			AckMode:          cfg.ackMode,
			Transport:        transportOf(cfg),
			Hostile:          cfg.hostile,
			SlowReaders:      slowReadersOf(cfg),
			HostileKinds:     hostileKindsOf(cfg),
			Renewers:         cfg.renewers,
			RelayMemoryBytes: cfg.relayMemory,
			RelayEnv:         cfg.relayEnv,
		},
	}
	for _, at := range cfg.crashes {
		rep.Config.CrashAtSeconds = append(rep.Config.CrashAtSeconds, at.Seconds())
	}
	rep.Config.Failover = cfg.failover
	if cfg.faults != nil {
		rep.Config.Faults = strconv.FormatUint(*cfg.faults, 10)
		rep.Config.FaultKinds = cfg.faultKinds
		rep.Config.FaultGapSeconds = cfg.faultGap.Seconds()
	}
	if len(cfg.crashes) > 0 {
		rep.Config.CrashDownSeconds = cfg.crashDown.Seconds()
		rep.Config.CrashReplica = "all"
		if cfg.crashReplica >= 0 {
			rep.Config.CrashReplica = strconv.Itoa(cfg.crashReplica)
		}
	}

	var (
		key     ed25519.PrivateKey
		urls    []string
		meter   relayMeter
		st      *stack
		applied int64
		redis   *redisSampler
		svc     *services
		fo      *failover
	)
	if cfg.faults != nil {
		// Before the stack, and torn down after it: the stack's database
		// is dropped on this Postgres.
		logger.Info("starting the campaign's own Postgres and Redis")
		if svc, err = startServices(ctx); err != nil {
			return fmt.Errorf("fault campaign: %w", err)
		}
		defer func() {
			if cerr := svc.close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("tear down the campaign's services: %w", cerr))
			}
		}()
		logger.Info("campaign services ready", "postgres", svc.pgURL, "redis", svc.redisURL, "postgres_dir", svc.pg.dir)
	}
	if cfg.failover != "" {
		// Before the stack, and torn down after it, as the campaign's.
		if fo, err = startFailover(ctx, cfg, logger); err != nil {
			return err
		}
		defer func() {
			if cerr := fo.f.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("tear down the formation: %w", cerr))
			}
		}()
	}
	if len(cfg.urls) == 0 {
		bin := cfg.relayBin
		if bin == "" {
			dir, err := os.MkdirTemp("", "relay-build-")
			if err != nil {
				return fmt.Errorf("build dir: %w", err)
			}
			defer os.RemoveAll(dir)
			logger.Info("building relay", "src", src)
			if bin, err = buildRelay(ctx, src, dir); err != nil {
				return err
			}
		}
		pg, redisURL := cfg.pg, cfg.redis
		if svc != nil {
			pg, redisURL = svc.pgURL, svc.redisURL
		} else if fo != nil {
			pg = fo.f.URL()
		} else if cfg.replicas > 1 {
			// Sampled before the relays start: the server's other clients
			// are the baseline.
			if redis, err = newRedisSampler(ctx, cfg.redis); err != nil {
				logger.Warn("redis connected_clients will not be sampled", "err", err)
			}
		}
		st, err = bootStack(ctx, stackParams{
			bin: bin, store: cfg.store, pg: pg, replicas: cfg.replicas, redis: redisURL, wait: cfg.wait,
			env: cfg.relayEnv, memory: cfg.relayMemory,
			// A herd waits for the relays to say they hold every poll.
			metrics: cfg.herd,
		}, logger)
		if err != nil {
			if redis != nil {
				redis.close()
			}
			return err
		}
		defer func() {
			// Whatever happened, the stack goes: relays get SIGTERM, the
			// memory cgroups and the throwaway database are removed, the
			// temp dir too.
			if cerr := st.close(context.WithoutCancel(ctx)); cerr != nil {
				err = errors.Join(err, fmt.Errorf("tear down: %w", cerr))
			}
		}()
		key, urls = st.key, st.urls
		for i := range st.replicas() {
			if l, err := procOpenFileLimit(st.relay(i).cmd.Process.Pid); err == nil {
				if rep.Machine.RelayOpenFile == 0 || l < rep.Machine.RelayOpenFile {
					rep.Machine.RelayOpenFile = l
				}
			}
		}
		if cfg.relayMemory > 0 {
			if applied, err = st.appliedLimit(); err != nil {
				logger.Warn("cannot read back the relay's memory limit", "err", err)
			} else {
				logger.Info("relay memory capped", "limit", cfg.relayMemory, "applied", applied)
			}
		}
		pm := &procMeter{st: st}
		if cfg.relayCommit != "" {
			pm.git = &report.Git{Commit: cfg.relayCommit}
		}
		meter = pm
	} else {
		rep.Config.Target = strings.Join(cfg.urls, ",")
		key, _ = issuerKey(cfg.issuerSeed) // validated with the config
		urls = cfg.urls
	}
	if len(cfg.metricsURLs) > 0 {
		// No keep-alive: a scrape a second needs no pool, and none is left
		// behind when the run ends.
		meter = &metricsMeter{urls: cfg.metricsURLs, hc: &http.Client{
			Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true},
		}}
	}
	cfg.sourceAddrs = sourceAddrs(cfg, urls, rep, logger)
	if cfg.sourceAddrs > 1 {
		rep.Config.SourceAddresses = cfg.sourceAddrs
	}

	r, err := newRunner(cfg, urls, key, meter, logger)
	if err != nil {
		return err
	}
	defer r.closeIdle()
	r.heldURLs = cfg.metricsURLs
	r.failover = fo
	if st != nil {
		r.stack = st
		if svc != nil {
			r.campaign = newCampaign(cfg, st.replicas(), svc)
			r.campaign.announce(logger)
		}
		if cfg.herd {
			r.heldURLs = nil
			for i := range st.replicas() {
				r.heldURLs = append(r.heldURLs, st.relay(i).metrics)
			}
		}
	}
	if redis != nil {
		defer redis.close()
		bg, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			redis.sampleLoop(bg)
		}()
		defer func() {
			stop()
			<-done
		}()
	}
	res, err := r.run(ctx)
	if err != nil {
		return err
	}
	if redis != nil {
		res.redis = redis.summary()
	}
	if st != nil {
		// The tester's spare connections go first: net/http's Shutdown
		// gives a connection that never sent a request five seconds
		// before it counts as idle.
		r.closeIdle()
		// Stopped before the report so that an unclean shutdown counts.
		stopErr := st.stopRelays()
		res.exits = st.unexpectedExits()
		if stopErr != nil && len(res.exits) == 0 {
			res.errors["relay shutdown"]++
		}
		if cfg.relayMemory > 0 {
			res.memory = st.memory(cfg.relayMemory, applied)
		}
	}
	res.fill(rep)
	if fo != nil {
		rep.Failover = fo.summary(res)
		if e := rep.Failover.Error; e != "" {
			rep.Failures = append(rep.Failures, "the failover did not complete: "+e)
			rep.OK = false
		}
	}
	rep.Date = time.Now().UTC().Truncate(time.Second)
	rep.LoadTester = selfUsage()

	fmt.Fprintln(stdout, rep.Line())
	for _, f := range rep.Failures {
		logger.Error("check failed", "failure", f)
	}
	if c := rep.Campaign; c != nil && !rep.OK {
		logger.Error("replay this campaign", "seed", c.Seed, "command", c.Replay)
	}
	if cfg.out != "" {
		if err := report.Write(cfg.out, rep); err != nil {
			return err
		}
	}
	if !rep.OK {
		return errChecksFailed
	}
	return nil
}

// hostileKindsOf is the report's word for the kinds: none unless some
// were left out.
func hostileKindsOf(cfg *config) string {
	if cfg.hostile == 0 || cfg.hostileKinds == "all" {
		return ""
	}
	return cfg.hostileKinds
}

// slowReadersOf is how many slow readers a round opens: none without
// hostile connections.
// transportOf names how recipients listened, for the report: "stream",
// or nothing for polls.
func transportOf(cfg *config) string {
	if cfg.stream {
		return "stream"
	}
	return ""
}

func slowReadersOf(cfg *config) int {
	if cfg.hostile == 0 {
		return 0
	}
	return cfg.slowReaders
}

// fileNeed is how many descriptors the tester needs: a connection per held
// poll, sends in flight, the hostile connections (a burst opens several),
// and slack. The relays it starts inherit its limit and need about as
// many: with several replicas each held poll can hold a Redis connection
// besides its socket.
func fileNeed(cfg *config) uint64 {
	slow := slowReadersOf(cfg)
	tester := cfg.pairs + 1024 + 5*cfg.hostile + slow + 64
	relay := 0
	if len(cfg.urls) == 0 {
		perRelay := (cfg.pairs + cfg.replicas - 1) / cfg.replicas
		relay = 2*perRelay + 5*cfg.hostile + slow + 4096
	}
	return uint64(max(tester, relay))
}

// sourceAddrs decides how many loopback source addresses the pairs'
// connections are spread over. Every connection to one relay needs an
// ephemeral port of its own per source address; a run that would use more
// than half the range gets more addresses, so that it never runs short
// while connections in TIME_WAIT hold some.
func sourceAddrs(cfg *config, urls []string, rep *report.Report, logger *slog.Logger) int {
	lo, hi, err := ephemeralPorts()
	if err == nil {
		rep.Machine.EphemeralPorts = fmt.Sprintf("%d-%d", lo, hi)
	}
	loopback4 := true
	for _, u := range urls {
		pu, perr := url.Parse(u)
		ip := net.ParseIP(pu.Hostname())
		if perr != nil || ip == nil || ip.To4() == nil || !ip.IsLoopback() {
			loopback4 = false
		}
	}
	n := cfg.sourceAddrs
	if n == 0 && err == nil {
		perRelay := (cfg.pairs+len(urls)-1)/len(urls) + 1024
		half := max((hi-lo+1)/2, 1)
		n = (perRelay + half - 1) / half
	}
	if n > 1 && !loopback4 {
		logger.Warn("connections come from one source address: the targets are not IPv4 loopback addresses", "wanted", n)
		return 1
	}
	if n > 1 {
		logger.Info("spreading connections over loopback source addresses", "addresses", n, "ephemeral_ports", rep.Machine.EphemeralPorts)
	}
	return max(n, 1)
}

type outcome int

const (
	notSent  outcome = iota
	accepted         // 202
	refused          // 429 or 503: admission, not a fault
	failed           // any other answer
	unknown          // no answer: the relay may or may not have committed
)

// sendRecord is one scheduled send, as the sender saw it.
type sendRecord struct {
	pair      int
	scheduled time.Time
	started   time.Time
	answered  time.Time
	firstAt   time.Time // when a poll first carried it
	outcome   outcome
	seq       int64
	delivered int
}

// received is one envelope as a recipient saw it.
type received struct {
	send int // index into sends, -1 when the id is not one of ours
	id   string
	seq  int64
	from string
	at   time.Time
	// asked is when the poll that brought it was sent: a poll sent before
	// a kill may bring what the killed relay wrote, read after the kill.
	asked time.Time
	// resyncs is how many times the recipient had resynchronised (a 409
	// cursor_ahead, then a poll without cursor and epoch) when the poll
	// that brought it was sent: across one, seqs may go back and the
	// relay may hand again what it handed before.
	resyncs int
	payload bool // the payload is the one sent under id
	life    int  // the recipient's registration (index into lives) that polled
}

type pair struct {
	idx       int
	household string
	sender    string
	recipient string
	senderTok string
	// sendClient speaks as the sender to relay sendRelay (its index among
	// the targets); the recipient's lives poll relay pollRelay.
	sendClient *client.Client
	sendRelay  int
	pollRelay  int

	// lives are the recipient's registrations, oldest first: a campaign's
	// removal ends one, and a registration with a fresh token begins the
	// next. Without -faults there is one. Guarded by the runner's mu.
	lives []*life
	// nextLife is closed when a life begins; guarded by mu.
	nextLife chan struct{}
	// crashes are when the recipient's client crashed and lost its place;
	// guarded by mu.
	crashes []time.Time
	// crash arms a client crash, the value its down time; nil without
	// -faults.
	crash chan time.Duration

	// Owned by the recipient's goroutine while the run lasts, then read by
	// the checks.
	cursor int64
	// epoch is the store epoch of cursor ("" until a relay named one).
	epoch string
	// polled is the life the cursor belongs to; lostPlace, that a crash
	// lost it and the next poll asks the relay.
	polled    int
	lostPlace bool
	// resync: a 409 cursor_ahead refused the cursor and epoch, and the
	// next poll leaves both out; resyncs counts those 409s.
	resync   bool
	resyncs  int
	received []received
}

// runner holds one run's state.
type runner struct {
	cfg    *config
	logger *slog.Logger
	// targets are the relays' base URLs.
	targets []string
	tr      *http.Transport
	meter   relayMeter
	pairs   []*pair
	order   []int  // pair of send i is order[i % len(order)]
	tag     string // prefix of this run's send ids
	key     ed25519.PrivateKey
	held    atomic.Int64
	peak    atomic.Int64
	// heldURLs are the relays' metrics, whose fn_held_polls a herd waits
	// on; none: the tester's own count.
	heldURLs []string
	// stack is the throwaway stack, which -crash kills and restarts; nil
	// against a relay this tester did not start.
	stack *stack
	// campaign is the -faults campaign; nil without one.
	campaign *campaign
	// failover is the -failover formation; nil without one.
	failover *failover
	// opts are the clients' options, exp the tokens' expiry.
	opts []client.Option
	exp  time.Time
	// giveUp ends a careful sender's retries: the end of the drain.
	giveUp time.Time
	// start is the first scheduled send.
	start time.Time

	mu       sync.Mutex
	sends    []sendRecord
	pending  int // accepted and not yet delivered
	counts   counts
	progress []time.Duration // accepted -> returned so far, for progress lines: the summary's figure
	// windows are the spans in which a relay was down for a crash the
	// tester caused, from just before the kill to a second after it
	// answered again.
	windows []window
	crashes []report.Crash
	kills   []time.Time
	// acked are the times of the acknowledgements the relay answered
	// (-ack explicit), to tell which a crash may have lost.
	acked   []time.Time
	samples []sample
}

type counts struct {
	started, accepted, delivered, late int
	refused, errors, retried           map[string]int
	// removal are answers a campaign's removal explains, by kind: sends
	// to the removed device, its old token's polls and acks.
	removal map[string]int
	// householdRefused are the load's own sends refused by their
	// household's limit, which no pair's modest rate should reach.
	householdRefused int
	// cursorAhead are the 409 cursor_ahead answers to polls and acks;
	// resyncs, the polls without cursor and epoch that answered after.
	cursorAhead, resyncs int
}

// requestTimeout bounds the load's every request. Never shorter than a
// held poll plus slack: a client timeout that cuts a held poll would be
// counted against the relay. With it set, the client package adds no
// shorter bound of its own. None with streams: a stream is one request
// for minutes, which a Timeout would cut; the client package then bounds
// every other request itself, and a stream by its silence.
func requestTimeout(cfg *config) time.Duration {
	if cfg.stream {
		return 0
	}
	return time.Duration(cfg.wait+30) * time.Second
}

func newRunner(cfg *config, urls []string, key ed25519.PrivateKey, meter relayMeter, logger *slog.Logger) (*runner, error) {
	sendLimit := max(1024, cfg.pairs+64)
	tr := newTransport(cfg.pairs+sendLimit+64, cfg.sourceAddrs)
	hc := &http.Client{Transport: tr, Timeout: requestTimeout(cfg)}
	r := &runner{
		cfg:     cfg,
		logger:  logger,
		targets: urls,
		tr:      tr,
		meter:   meter,
		tag:     randomHex(4),
		key:     key,
		counts:  counts{refused: map[string]int{}, errors: map[string]int{}, retried: map[string]int{}, removal: map[string]int{}},
		// One client per token, all on hc: a client is a few fields, the
		// connections are hc's.
		opts: []client.Option{client.WithHTTPClient(hc), client.WithCodec(codec(cfg.codec))},
		exp:  time.Now().Add(time.Duration(cfg.wait)*time.Second + cfg.duration + cfg.drain + time.Hour),
	}
	// Each pair is a household of its own, two devices, as a family's
	// phone and laptop would be: a relay's per-household limits then see
	// what they would see in the field, not one household sending
	// everything.
	households := "lt-" + time.Now().UTC().Format("20060102T150405") + "-" + r.tag + "-"
	n := len(urls)
	for k := range cfg.pairs {
		p := &pair{
			idx:       k,
			sender:    "s" + strconv.Itoa(k),
			recipient: "r" + strconv.Itoa(k),
			// With several relays the sender sits on another relay than
			// its recipient, so every wake-up crosses replicas.
			pollRelay: k % n,
			sendRelay: (k + 1) % n,
		}
		p.household = households + strconv.Itoa(k)
		p.senderTok = r.mint(p.household, p.sender, token.ScopeDevice, time.Now())
		var err error
		if p.sendClient, err = client.New(urls[p.sendRelay], p.senderTok, r.opts...); err != nil {
			return nil, err
		}
		tok := r.mint(p.household, p.recipient, token.ScopeDevice, time.Now())
		c, err := client.New(urls[p.pollRelay], tok, r.opts...)
		if err != nil {
			return nil, err
		}
		p.lives = []*life{newLife(tok, c)}
		p.nextLife = make(chan struct{})
		r.pairs = append(r.pairs, p)
	}
	r.order = rand.Perm(cfg.pairs)
	if cfg.faults != nil {
		// The campaign's seed picks the order too, so that a replay
		// offers the same sends to the same pairs at the same times.
		r.order = rand.New(rand.NewPCG(*cfg.faults, seedOrder)).Perm(cfg.pairs)
		for _, p := range r.pairs {
			p.crash = make(chan time.Duration, 1)
		}
	}
	return r, nil
}

// mint issues a token of this run's issuer.
func (r *runner) mint(household, device, scope string, issued time.Time) string {
	tok, err := token.Mint(r.key, token.Claims{
		Household: household, Device: device, Expires: r.exp,
		IssuedAt: issued, Scope: scope,
	})
	if err != nil {
		panic(err) // only on empty claims, which cannot happen here
	}
	return tok
}

// current is the recipient's latest life and its index.
func (r *runner) current(p *pair) (*life, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return p.lives[len(p.lives)-1], len(p.lives) - 1
}

func (r *runner) closeIdle() { r.tr.CloseIdleConnections() }

func (r *runner) sendID(i int) string { return r.tag + "-" + strconv.Itoa(i) }

func (r *runner) sendIndex(id string) int {
	rest, ok := strings.CutPrefix(id, r.tag+"-")
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || i >= len(r.sends) {
		return -1
	}
	return i
}

// payload is the send's id followed by a filler that depends on the id, so
// the recipient can check every byte.
func payload(id string, size int) []byte {
	b := make([]byte, max(size, len(id)))
	n := copy(b, id)
	for j := n; j < len(b); j++ {
		b[j] = 'a' + byte((j+len(id))%26)
	}
	return b
}

// result is what a run measured, before it becomes a report.
type result struct {
	cfg         *config
	sends       []sendRecord
	pairs       []*pair
	peakHeld    int
	heldEnd     int
	start, end  time.Time
	late        int
	refused     map[string]int
	errors      map[string]int
	retried     map[string]int
	relay       report.Relay
	undelivered int // still owed when the drain ended
	herdHeld    time.Duration

	householdRefused int
	// cursorAhead are the 409 cursor_ahead answers, resyncs the
	// resynchronisations after them.
	cursorAhead, resyncs int
	removal              map[string]int
	campaign             *report.Campaign
	crashes              []report.Crash
	kills                []time.Time
	acked                []time.Time
	steady               *report.Steady
	hostile              *report.Hostile
	renewals             *report.Renewals
	// Filled by load from the stack, after the relays stopped.
	exits  []string
	memory *report.Memory
	redis  *report.Redis
}

func (r *runner) run(ctx context.Context) (*result, error) {
	if err := r.register(ctx); err != nil {
		return nil, err
	}
	var rn *renewers
	if r.cfg.renewers > 0 {
		var err error
		if rn, err = newRenewers(r, r.cfg.renewers); err != nil {
			return nil, err
		}
		if err := rn.pair(ctx); err != nil {
			return nil, err
		}
	}
	sched := newSchedule(time.Time{}, r.cfg.rate, r.cfg.duration)
	r.sends = make([]sendRecord, sched.n)

	polls, stopPolls := context.WithCancel(ctx)
	var pollers sync.WaitGroup
	defer func() {
		stopPolls()
		pollers.Wait()
	}()
	t0 := time.Now().Add(100 * time.Millisecond)
	ramp := time.Duration(r.cfg.wait) * time.Second
	if r.cfg.herd {
		ramp = 0
	}
	for _, p := range r.pairs {
		// Without -herd the first polls spread over one wait period, so
		// their expiries spread too, as a settled population's would.
		first := t0.Add(ramp * time.Duration(p.idx) / time.Duration(len(r.pairs)))
		if r.cfg.stream {
			pollers.Go(func() { r.streamLoop(polls, p, first) })
		} else {
			pollers.Go(func() { r.pollLoop(polls, p, first) })
		}
	}

	sched.start = t0.Add(ramp)
	r.announce(ramp)
	var herdHeld time.Duration
	if r.cfg.herd {
		// A herd is a population in step: every poll started at t0, so
		// they expire together for the whole run. The sends start once
		// the population holds, as "N held at R/s" says; the connection
		// storm that forms it is the restart the -crash runs measure.
		var ok bool
		if herdHeld, ok = r.waitHeld(ctx, t0, t0.Add(time.Duration(r.cfg.wait)*time.Second)); !ok {
			return nil, ctx.Err()
		}
		sched.start = t0.Add(herdHeld)
	}
	end := sched.start.Add(r.cfg.duration)
	r.start, r.giveUp = sched.start, end.Add(r.cfg.drain)
	for i := range r.sends {
		r.sends[i].pair = r.order[i%len(r.order)]
		r.sends[i].scheduled = sched.at(i)
	}

	bg, stopBG := context.WithCancel(ctx)
	var background sync.WaitGroup
	background.Go(func() { r.progressLoop(bg, t0) })
	if m, ok := r.meter.(*metricsMeter); ok {
		background.Go(func() { m.sampleLoop(bg) })
	}
	if r.meter != nil {
		background.Go(func() { r.sampleLoop(bg, sched.start, end) })
	}
	defer func() {
		stopBG()
		background.Wait()
	}()

	if !sleepUntil(ctx, sched.start) {
		return nil, ctx.Err()
	}
	var cpuStart time.Duration
	if r.meter != nil {
		var err error
		if cpuStart, err = r.meter.cpu(ctx); err != nil {
			r.logger.Warn("relay cpu", "err", err)
		}
	}
	r.logger.Info("sending", "sends", sched.n, "rate", r.cfg.rate, "pairs", len(r.pairs), "held", r.held.Load())

	var crashes sync.WaitGroup
	if len(r.cfg.crashes) > 0 && r.stack != nil {
		crashes.Go(func() { r.crashLoop(ctx, sched.start) })
	}
	if r.campaign != nil {
		crashes.Go(func() { r.campaignLoop(ctx, sched.start) })
	}
	if r.failover != nil {
		crashes.Go(func() { r.failoverLoop(ctx, sched.start) })
	}
	var h *hostile
	hctx, stopHostile := context.WithCancel(ctx)
	var hostiles sync.WaitGroup
	defer func() {
		stopHostile()
		hostiles.Wait()
	}()
	if r.cfg.hostile > 0 {
		h = newHostile(r, r.cfg)
		hostiles.Go(func() { h.run(hctx, end) })
	}
	var renewing sync.WaitGroup
	if rn != nil {
		renewing.Go(func() { rn.run(ctx, sched.start, end) })
	}

	sendLimit := max(1024, r.cfg.pairs+64)
	openLoop(ctx, sched, sendLimit, func(i int, at time.Time) { r.send(ctx, i, at) })
	heldEnd := r.heldAfter(ctx)
	crashes.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	// Drain: wait for every accepted send to come back, bounded.
	deadline := time.Now().Add(r.cfg.drain)
	tick := time.NewTicker(20 * time.Millisecond)
	for r.owed() > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			tick.Stop()
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
	tick.Stop()
	drained := time.Now()
	undelivered := r.owed()

	res := &result{cfg: r.cfg, start: sched.start, end: drained, undelivered: undelivered, heldEnd: heldEnd, herdHeld: herdHeld}
	if r.meter != nil {
		res.relay = r.meter.read(ctx, cpuStart)
	}
	if h != nil {
		// Hostile requests still waiting for the relay to close their
		// connection get until their limit, and no longer.
		waited := make(chan struct{})
		go func() {
			for {
				d := time.Until(h.stopAt(end))
				if d <= 0 {
					stopHostile()
					return
				}
				select {
				case <-time.After(d):
				case <-waited:
					return
				}
			}
		}()
		hostiles.Wait()
		close(waited)
		res.hostile = h.summary()
	}
	renewing.Wait()
	if rn != nil {
		res.renewals = rn.summary(end.Sub(sched.start), res.hostile)
	}

	stopPolls()
	pollers.Wait()
	// Whatever a cancelled poll had in flight is still owed (its cursor
	// was never acknowledged), so one last pass collects it, and anything
	// else the relay holds for these devices.
	r.sweep(ctx)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	res.sends = r.sends
	res.pairs = r.pairs
	res.peakHeld = int(r.peak.Load())
	res.late = r.counts.late
	res.refused = r.counts.refused
	res.errors = r.counts.errors
	res.retried = r.counts.retried
	res.householdRefused = r.counts.householdRefused
	res.cursorAhead, res.resyncs = r.counts.cursorAhead, r.counts.resyncs
	res.crashes = r.crashes
	res.kills = r.kills
	res.acked = r.acked
	res.removal = r.counts.removal
	clientCrashes := 0
	for _, p := range r.pairs {
		clientCrashes += len(p.crashes)
		for _, l := range p.lives {
			l.end()
		}
	}
	if r.campaign != nil {
		res.campaign = r.campaign.summary(clientCrashes)
	}
	res.steady = steadyState(r.samples, sched.start, end)
	return res, nil
}

// owed is how many accepted sends have not arrived and must: in a
// campaign, those to a life that was never removed.
func (r *runner) owed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.owedLocked()
}

func (r *runner) owedLocked() int {
	if r.campaign == nil {
		return r.pending
	}
	n := 0
	for _, rec := range r.sends {
		if rec.outcome == accepted && rec.delivered == 0 && fateOf(rec, r.pairs[rec.pair].lives) == owed {
			n++
		}
	}
	return n
}

// register creates every recipient, a few at a time. Senders need no
// registration.
func (r *runner) register(ctx context.Context) error {
	errs := make(chan error, 1)
	next := make(chan *pair)
	var wg sync.WaitGroup
	for range min(32, len(r.pairs)) {
		wg.Go(func() {
			for p := range next {
				if err := r.registerOne(ctx, p); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for _, p := range r.pairs {
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

func (r *runner) registerOne(ctx context.Context, p *pair) error {
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		l := p.lives[0]
		began := time.Now()
		resp, err := l.client.Register(ctx)
		if err == nil {
			p.cursor, l.cursor = resp.Cursor, resp.Cursor
			p.epoch, l.epoch = resp.Epoch, resp.Epoch
			r.mu.Lock()
			l.registering, l.registered = began, time.Now()
			r.mu.Unlock()
			return nil
		}
		var se *client.Error
		if !errors.As(err, &se) || !turnedAway(se) || attempt >= 10 {
			return fmt.Errorf("%s: %w", p.recipient, err)
		}
		sleepFor(ctx, max(se.RetryAfter, 100*time.Millisecond))
	}
}

func (r *runner) send(ctx context.Context, i int, at time.Time) {
	p := r.pairs[r.sends[i].pair]
	id := r.sendID(i)
	to, body := []string{p.recipient}, payload(id, r.cfg.payload)
	started := time.Now()
	r.mu.Lock()
	rec := &r.sends[i]
	rec.started = started
	r.counts.started++
	if started.Sub(at) > r.cfg.late {
		r.counts.late++
	}
	r.mu.Unlock()

	// With -crash, -faults or -failover the sender is a careful client: a send that
	// got no definitive answer (none at all, or 503) goes again with the
	// same id, so that one the relay committed just before it died is
	// answered, not left in doubt.
	careful := len(r.cfg.crashes) > 0 || r.campaign != nil || r.failover != nil
	var resp client.SendResult
	var err error
	from := started
	for attempt := 0; ; attempt++ {
		resp, err = p.sendClient.SendOnce(ctx, id, to, body)
		if err == nil || ctx.Err() != nil || !careful || !retryable(err) || time.Now().After(r.giveUp) {
			break
		}
		r.failure("send", p.sendRelay, err, from, time.Now())
		sleepFor(ctx, retryWait(attempt, err))
		from = time.Now()
	}
	answered := time.Now()

	r.mu.Lock()
	defer r.mu.Unlock()
	rec.answered = answered
	var se *client.Error
	switch {
	case err == nil:
		rec.outcome = accepted
		if !rec.firstAt.IsZero() { // a poll carried it before its 202 came
			r.progress = append(r.progress, rec.firstAt.Sub(answered))
		}
		rec.seq = -1
		for _, d := range resp.Deliveries {
			if d.Device == p.recipient {
				rec.seq = d.Seq
			}
		}
		if resp.ID != id || len(resp.Deliveries) != 1 || rec.seq < 1 {
			r.counts.errors["send answer does not match the request"]++
		}
		r.counts.accepted++
		if rec.delivered == 0 {
			r.pending++
		}
	case ctx.Err() != nil:
		rec.outcome = unknown
	case errors.As(err, &se) && se.Status == http.StatusNotFound && se.Code == "unknown_device" && p.absentDuring(from, answered):
		// The recipient was removed meanwhile: the answer the protocol
		// gives.
		rec.outcome = failed
		r.counts.removal["send "+kind(se)]++
	case errors.As(err, &se) && turnedAway(se):
		rec.outcome = refused
		r.failureLocked("send", p.sendRelay, err, from, answered)
	case errors.As(err, &se):
		rec.outcome = failed
		r.failureLocked("send", p.sendRelay, err, from, answered)
	default:
		rec.outcome = unknown
		r.failureLocked("send", p.sendRelay, err, from, answered)
	}
}

// carefulBackoff is how long a careful client waits before it tries
// again: 25 to 50 ms at first, doubling up to a second, and never less
// than the relay's Retry-After (which, at a second or more, is then waited
// exactly).
var carefulBackoff = backoff.Policy{Base: 25 * time.Millisecond, Cap: time.Second}

// retryWait is carefulBackoff's wait before retry number attempt (0 for
// the first) after err.
func retryWait(attempt int, err error) time.Duration {
	var floor time.Duration
	var se *client.Error
	if errors.As(err, &se) {
		floor = se.RetryAfter
	}
	return carefulBackoff.Wait(attempt, floor)
}

// pollLoop holds the recipient's polls, one after another, until ctx ends.
func (r *runner) pollLoop(ctx context.Context, p *pair, first time.Time) {
	if !sleepUntil(ctx, first) {
		return
	}
	for ctx.Err() == nil {
		r.pollOnce(ctx, p, r.cfg.wait)
	}
}

// heldAfter is how many polls are in flight as the sends end. A poll
// just answered (the last sends' recipients' most likely) is between its
// answer and the next poll for a moment, so the count is the highest seen
// over a short while, or the population as soon as it is seen whole.
func (r *runner) heldAfter(ctx context.Context) int {
	most := r.held.Load()
	deadline := time.Now().Add(250 * time.Millisecond)
	for most < int64(len(r.pairs)) && time.Now().Before(deadline) && sleepFor(ctx, 5*time.Millisecond) {
		most = max(most, r.held.Load())
	}
	return int(most)
}

// pollOnce makes one poll with the recipient's latest life and records
// what it returned. It reports whether the relay has more waiting. With
// -ack explicit it polls without a cursor and acknowledges what it
// received with POST /v1/ack.
func (r *runner) pollOnce(ctx context.Context, p *pair, wait int) (more bool, err error) {
	l, li := r.current(p)
	if li != p.polled {
		// A new registration starts over where it says.
		p.polled, p.cursor, p.epoch, p.lostPlace, p.resync = li, l.cursor, l.epoch, false, false
	}
	// The next life's beginning ends this one's poll, as a client given a
	// new token would stop using the old.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.ctx, cancel)()
	r.holding()
	// With explicit acks the poll leaves the cursor out, so the relay
	// answers from the cursor it has stored; so does a client that lost
	// its place, and one resynchronising after a 409 cursor_ahead. The
	// epoch goes with the cursor the client keeps, whether it sends the
	// cursor or not; the last two have none.
	q := client.PollQuery{Cursor: p.cursor, OmitCursor: r.cfg.ackMode == "explicit" || p.lostPlace || p.resync, Wait: wait}
	if !p.lostPlace && !p.resync {
		q.Epoch = p.epoch
	}
	from := time.Now()
	resp, err := l.client.Poll(ctx, q)
	r.held.Add(-1)
	at := time.Now()
	if err != nil {
		return false, r.listenFailed(ctx, p, l, li, "poll", q.Epoch, err, from, at)
	}
	r.record(p, li, resp, from, at)
	p.lostPlace, p.resync = false, false
	crashed := len(resp.Envelopes) > 0 && r.crashClient(ctx, p)
	if r.cfg.ackMode == "explicit" && len(resp.Envelopes) > 0 && !crashed {
		r.ack(ctx, p, l, client.Position{Cursor: resp.Cursor, Epoch: p.epoch})
	}
	return resp.More, nil
}

// streamAckEvery and streamAckSeqs are when a stream's position is
// acknowledged, as the relay's own clients do: at an event or ping once
// streamAckEvery has passed since the last ack, at once when
// streamAckSeqs seqs are unacknowledged; the next stream's cursor
// acknowledges the rest.
const (
	streamAckEvery = 60 * time.Second
	streamAckSeqs  = 1000
)

// streamLoop holds the recipient's streams, one after another, until ctx
// ends.
func (r *runner) streamLoop(ctx context.Context, p *pair, first time.Time) {
	if !sleepUntil(ctx, first) {
		return
	}
	for ctx.Err() == nil {
		r.streamOnce(ctx, p)
	}
}

// streamOnce holds one stream with the recipient's latest life and
// records each batch it carries, as pollOnce records a poll's answer.
// It acknowledges lazily (streamAckEvery, streamAckSeqs), or each batch
// with -ack explicit.
func (r *runner) streamOnce(ctx context.Context, p *pair) error {
	l, li := r.current(p)
	if li != p.polled {
		p.polled, p.cursor, p.epoch, p.lostPlace, p.resync = li, l.cursor, l.epoch, false, false
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.ctx, cancel)()
	r.holding()
	defer r.held.Add(-1)
	q := client.StreamQuery{Cursor: p.cursor, OmitCursor: r.cfg.ackMode == "explicit" || p.lostPlace || p.resync}
	if !p.lostPlace && !p.resync {
		q.Epoch = p.epoch
	}
	from := time.Now()
	s, err := l.client.Stream(ctx, q)
	if err != nil {
		return r.listenFailed(ctx, p, l, li, "stream", q.Epoch, err, from, time.Now())
	}
	defer s.Close()
	acked, ackedAt := p.cursor, time.Now()
	ack := func() {
		if p.cursor != acked && !p.lostPlace {
			r.ack(ctx, p, l, client.Position{Cursor: p.cursor, Epoch: p.epoch})
			acked, ackedAt = p.cursor, time.Now()
		}
	}
	for {
		ev, err := s.Next()
		at := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.failure("stream", p.pollRelay, err, from, at)
			sleepFor(ctx, 200*time.Millisecond)
			return err
		}
		switch ev.Kind {
		case "ready", "envelopes":
			// Every batch counts as asked for when the stream opened: the
			// earliest the relay can have written it.
			r.record(p, li, ev.Result, from, at)
			p.lostPlace, p.resync = false, false
			if len(ev.Result.Envelopes) > 0 && r.crashClient(ctx, p) {
				return nil
			}
			if r.cfg.ackMode == "explicit" || time.Since(ackedAt) >= streamAckEvery || p.cursor-acked >= streamAckSeqs {
				ack()
			}
		case "ping":
			if time.Since(ackedAt) >= streamAckEvery {
				ack()
			}
		case "end":
			switch ev.End.Reason {
			case "superseded", "drained", "expired":
				return nil
			}
			if ev.End.Err != nil {
				return r.listenFailed(ctx, p, l, li, "stream", q.Epoch, ev.End.Err, from, at)
			}
			err := fmt.Errorf("stream ended with %q", ev.End.Reason)
			r.failure("stream", p.pollRelay, err, from, at)
			return err
		}
	}
}

// holding counts one more poll or stream in flight and keeps the peak.
func (r *runner) holding() {
	held := r.held.Add(1)
	for {
		peak := r.peak.Load()
		if held <= peak || r.peak.CompareAndSwap(peak, held) {
			return
		}
	}
}

// listenFailed sorts out a poll's or stream's failure, from..at: a
// removal's 401 waits for the next life, a cursor_ahead resynchronises,
// anything else is counted and waited out before the next try. It
// returns err.
func (r *runner) listenFailed(ctx context.Context, p *pair, l *life, li int, op, epoch string, err error, from, at time.Time) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if r.removalAnswer(l, op, err, at) {
		r.awaitLife(ctx, p, li)
		return err
	}
	if r.cursorAhead(p, op, epoch, err, from, at) {
		return err
	}
	r.failure(op, p.pollRelay, err, from, at)
	var se *client.Error
	switch {
	case errors.As(err, &se) && turnedAway(se):
		sleepFor(ctx, max(se.RetryAfter, 100*time.Millisecond))
	case errors.As(err, &se):
		sleepFor(ctx, time.Second) // a faulty relay must not be hammered
	default:
		sleepFor(ctx, 200*time.Millisecond)
	}
	return err
}

// ack acknowledges up to pos, again and again while no definitive
// answer comes, as a client that must not lose its place would.
func (r *runner) ack(ctx context.Context, p *pair, l *life, pos client.Position) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		from := time.Now()
		err := l.client.Ack(ctx, pos)
		if err == nil {
			r.mu.Lock()
			r.acked = append(r.acked, time.Now())
			r.staleAnswerLocked(p, l, "ack", p.pollRelay, from)
			r.mu.Unlock()
			return
		}
		if ctx.Err() != nil || r.removalAnswer(l, "ack", err, time.Now()) || r.cursorAhead(p, "ack", pos.Epoch, err, from, time.Now()) {
			return
		}
		r.failure("ack", p.pollRelay, err, from, time.Now())
		if !retryable(err) {
			return
		}
		sleepFor(ctx, retryWait(attempt, err))
	}
}

// failure counts a request to relay that did not get the answer it
// wanted: as retried when that relay was down meanwhile for a crash the
// tester caused, as refused for 429 and 503, else as an error.
func (r *runner) failure(op string, relay int, err error, from, to time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failureLocked(op, relay, err, from, to)
}

func (r *runner) failureLocked(op string, relay int, err error, from, to time.Time) {
	var se *client.Error
	switch {
	case r.inCrashWindow(relay, from, to, err):
		r.counts.retried[errKind(op, err)]++
	case errors.As(err, &se) && turnedAway(se):
		r.counts.refused[op+" "+kind(se)]++
		if op == "send" && se.Limit == "household_send_rate" {
			r.counts.householdRefused++
		}
	default:
		r.counts.errors[errKind(op, err)]++
	}
}

// record keeps what a poll of life li returned. Only the recipient's
// goroutine calls it, so p's own fields need no lock; the shared tallies
// do.
func (r *runner) record(p *pair, li int, resp client.PollResult, asked, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.staleAnswerLocked(p, p.lives[li], "poll", p.pollRelay, asked)
	for _, e := range resp.Envelopes {
		got := received{send: r.sendIndex(e.ID), id: e.ID, seq: e.Seq, from: e.From, at: at, asked: asked, life: li, resyncs: p.resyncs}
		if got.send >= 0 {
			rec := &r.sends[got.send]
			got.payload = string(e.Payload) == string(payload(e.ID, r.cfg.payload))
			if rec.delivered == 0 {
				if rec.outcome == accepted {
					r.pending--
				}
				r.counts.delivered++
				rec.firstAt = at
				if rec.outcome == accepted { // else when its 202 comes
					r.progress = append(r.progress, at.Sub(rec.answered))
				}
			}
			rec.delivered++
		}
		p.received = append(p.received, got)
	}
	// The relay's cursor is the last seq returned, or the stored cursor
	// when nothing was; either way it is where the next poll acknowledges,
	// in the answer's epoch. A resynchronising answer names both.
	p.cursor = resp.Cursor
	if p.resync || resp.Epoch != "" {
		p.epoch = resp.Epoch
	}
	if p.resync {
		r.counts.resyncs++
	}
}

// cursorAhead handles a 409 cursor_ahead to a poll or ack that carried
// epoch: the recipient resynchronises, polling once without cursor and
// epoch and taking that answer's, as PROTOCOL.md says a client does. Every
// such answer is counted; one that names no other epoch than the one sent
// (a head behind the cursor with the store's history intact, or a relay
// without epochs) is an error as well.
func (r *runner) cursorAhead(p *pair, op, epoch string, err error, from, to time.Time) bool {
	var se *client.Error
	if !errors.As(err, &se) || !se.CursorAhead() {
		return false
	}
	r.mu.Lock()
	r.counts.cursorAhead++
	if se.Epoch == "" || se.Epoch == epoch {
		r.failureLocked(op, p.pollRelay, err, from, to)
	}
	r.mu.Unlock()
	if !p.resync {
		p.resync = true
		p.resyncs++
	}
	return true
}

// sweep polls every recipient once more without waiting, after the held
// polls ended, until the relay says nothing more is waiting.
func (r *runner) sweep(ctx context.Context) {
	next := make(chan *pair)
	var wg sync.WaitGroup
	for range min(32, len(r.pairs)) {
		wg.Go(func() {
			for p := range next {
				for attempt := 0; attempt < 20 && ctx.Err() == nil; attempt++ {
					more, err := r.pollOnce(ctx, p, 0)
					if err == nil && !more {
						break
					}
				}
			}
		})
	}
	for _, p := range r.pairs {
		select {
		case next <- p:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
}

func (r *runner) progressLoop(ctx context.Context, t0 time.Time) {
	tick := time.NewTicker(r.cfg.progress)
	defer tick.Stop()
	lastAccepted, last := 0, time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			r.mu.Lock()
			c := r.counts
			sorted := slices.Clone(r.progress)
			pending := r.owedLocked()
			refused, errs := report.Total(c.refused), report.Total(c.errors)
			r.mu.Unlock()
			p50, p99 := progressLatencies(sorted)
			rate := float64(c.accepted-lastAccepted) / now.Sub(last).Seconds()
			lastAccepted, last = c.accepted, now
			r.logger.Info("progress",
				"t", now.Sub(t0).Round(time.Second).String(),
				"held", r.held.Load(), "peak_held", r.peak.Load(),
				"sends_per_s", fmt.Sprintf("%.1f", rate),
				"accepted", c.accepted, "delivered", c.delivered, "owed", pending,
				"accepted_to_returned_p50", p50, "accepted_to_returned_p99", p99,
				"late", c.late, "refused", refused, "errors", errs)
		}
	}
}

// progressLatencies are a progress line's p50 and p99 of samples (sorted
// here), "" for none: computed and printed as the summary's are, so that
// the two show the same figure for the same samples.
func progressLatencies(samples []time.Duration) (p50, p99 string) {
	if len(samples) == 0 {
		return "", ""
	}
	s := report.Summarize(samples)
	return report.FormatMS(s.P50), report.FormatMS(s.P99)
}

// announce says, before anything is sent, how long the run will take and
// why: polls first, for a ramp with no sends, then the sends, then up to
// the drain for what is still owed.
func (r *runner) announce(ramp time.Duration) {
	why := "the first polls spread over one wait period (-wait) so that they expire as a settled population's do, with no sends"
	if r.cfg.herd {
		ramp = time.Duration(r.cfg.wait) * time.Second
		why = "every poll starts at once (-herd); the sends start as soon as all are held, at most one wait period (-wait) later"
	}
	r.logger.Info("plan: polls first, then sends, then the drain",
		"ramp", ramp.String(), "ramp_why", why, "sends", r.cfg.duration.String(),
		"drain_at_most", r.cfg.drain.String(), "about", (ramp + r.cfg.duration).Round(time.Second).String(),
		"at_most", (ramp + r.cfg.duration + r.cfg.drain).Round(time.Second).String())
}

// sleepUntil waits for t or ctx; it reports whether t was reached.
// waitHeld waits until every recipient holds a poll, or until deadline,
// and says how long after t0 that was. A poll is held once the tester has
// sent it and, where the relays' metrics can be read, once the relays'
// fn_held_polls counts it: a request in flight may not have reached its
// relay yet. It reports false only when ctx ends.
func (r *runner) waitHeld(ctx context.Context, t0, deadline time.Time) (time.Duration, bool) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	urls := r.heldURLs
	var scraped time.Time
	for {
		now := time.Now()
		held := int(r.held.Load()) >= len(r.pairs)
		if held && len(urls) > 0 {
			held = false
			// A scrape costs the relays a gather of their registry, while
			// they take the population's storm: no more than one in 50 ms.
			if now.Sub(scraped) >= 50*time.Millisecond {
				scraped = now
				n, err := relaysHeld(ctx, hc, urls)
				if err != nil {
					r.logger.Warn("the relays' held polls cannot be read; the tester's count decides", "err", err)
					urls = nil
				}
				held = err != nil || n >= len(r.pairs)
			}
		}
		if held || now.After(deadline) {
			return max(0, now.Sub(t0)), true
		}
		select {
		case <-ctx.Done():
			return 0, false
		case <-tick.C:
		}
	}
}

// relaysHeld is fn_held_polls summed over the relays' metrics.
func relaysHeld(ctx context.Context, hc *http.Client, urls []string) (int, error) {
	var n float64
	for _, u := range urls {
		err := scrape(ctx, hc, u, func(r io.Reader) error {
			v, err := parseGauge(r, "fn_held_polls")
			n += v
			return err
		})
		if err != nil {
			return 0, err
		}
	}
	return int(n), nil
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	return sleepFor(ctx, time.Until(t))
}

func sleepFor(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}
