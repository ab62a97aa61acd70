package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
	soft, _, limErr := raiseFileLimit()
	if limErr != nil {
		logger.Warn("cannot raise the open-file limit", "err", limErr)
	}
	// One connection per held poll, plus sends in flight and slack.
	if need := uint64(cfg.pairs + 1024); soft < need {
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
			Target:          "throwaway",
			Pairs:           cfg.pairs,
			Rate:            cfg.rate,
			DurationSeconds: cfg.duration.Seconds(),
			WaitSeconds:     cfg.wait,
			PayloadBytes:    cfg.payload,
			Codec:           cfg.codec,
			Herd:            cfg.herd,
			DrainSeconds:    cfg.drain.Seconds(),
		},
	}

	var (
		key   ed25519.PrivateKey
		urls  []string
		meter relayMeter
		st    *stack
	)
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
		st, err = bootStack(ctx, stackParams{
			bin: bin, store: cfg.store, pg: cfg.pg, replicas: cfg.replicas, redis: cfg.redis, wait: cfg.wait,
		}, logger)
		if err != nil {
			return err
		}
		defer func() {
			// Whatever happened, the stack goes: relays get SIGTERM, the
			// throwaway database is dropped, the temp dir removed.
			if cerr := st.close(context.WithoutCancel(ctx)); cerr != nil {
				err = errors.Join(err, fmt.Errorf("tear down: %w", cerr))
			}
		}()
		key, urls = st.key, st.urls
		pm := &procMeter{}
		for _, r := range st.relays {
			pm.pids = append(pm.pids, r.cmd.Process.Pid)
			if l, err := procOpenFileLimit(r.cmd.Process.Pid); err == nil {
				if rep.Machine.RelayOpenFile == 0 || l < rep.Machine.RelayOpenFile {
					rep.Machine.RelayOpenFile = l
				}
			}
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

	r := newRunner(cfg, urls, key, meter, logger)
	defer r.closeIdle()
	res, err := r.run(ctx)
	if err != nil {
		return err
	}
	if st != nil {
		// Stopped before the report so that an unclean shutdown counts.
		if err := st.stopRelays(); err != nil {
			res.errors["relay shutdown"]++
		}
	}
	res.fill(rep)
	rep.Date = time.Now().UTC().Truncate(time.Second)
	rep.LoadTester = selfUsage()

	fmt.Fprintln(stdout, rep.Line())
	for _, f := range rep.Failures {
		logger.Error("check failed", "failure", f)
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
	outcome   outcome
	seq       int64
	delivered int
}

// received is one envelope as a recipient saw it.
type received struct {
	send    int // index into sends, -1 when the id is not one of ours
	id      string
	seq     int64
	from    string
	at      time.Time
	payload bool // the payload is the one sent under id
}

type pair struct {
	idx          int
	sender       string
	recipient    string
	senderTok    string
	recipientTok string
	sendAPI      *api
	pollAPI      *api

	// Owned by the recipient's goroutine while the run lasts, then read by
	// the checks.
	cursor   int64
	received []received
}

// runner holds one run's state.
type runner struct {
	cfg    *config
	logger *slog.Logger
	apis   []*api
	tr     *http.Transport
	meter  relayMeter
	pairs  []*pair
	order  []int  // pair of send i is order[i % len(order)]
	tag    string // prefix of this run's send ids
	held   atomic.Int64
	peak   atomic.Int64

	mu       sync.Mutex
	sends    []sendRecord
	pending  int // accepted and not yet delivered
	counts   counts
	progress []time.Duration // started -> returned so far, for progress lines
}

type counts struct {
	started, accepted, delivered, late int
	refused, errors                    map[string]int
}

func newRunner(cfg *config, urls []string, key ed25519.PrivateKey, meter relayMeter, logger *slog.Logger) *runner {
	sendLimit := max(1024, cfg.pairs+64)
	tr := newTransport(cfg.pairs + sendLimit + 64)
	// Never shorter than a held poll plus slack: a client timeout that cuts
	// a held poll would be counted against the relay.
	hc := &http.Client{Transport: tr, Timeout: time.Duration(cfg.wait+30) * time.Second}
	r := &runner{
		cfg:    cfg,
		logger: logger,
		tr:     tr,
		meter:  meter,
		tag:    randomHex(4),
		counts: counts{refused: map[string]int{}, errors: map[string]int{}},
	}
	for _, u := range urls {
		r.apis = append(r.apis, &api{base: u, hc: hc, msgpack: cfg.codec == "msgpack"})
	}
	// Each pair is a household of its own, two devices, as a family's
	// phone and laptop would be: a relay's per-household limits then see
	// what they would see in the field, not one household sending
	// everything.
	households := "lt-" + time.Now().UTC().Format("20060102T150405") + "-" + r.tag + "-"
	exp := time.Now().Add(time.Duration(cfg.wait)*time.Second + cfg.duration + cfg.drain + time.Hour)
	mint := func(household, device string) string {
		tok, err := token.Mint(key, token.Claims{
			Household: household, Device: device, Expires: exp,
			IssuedAt: time.Now(), Scope: token.ScopeDevice,
		})
		if err != nil {
			panic(err) // only on empty claims, which cannot happen here
		}
		return tok
	}
	n := len(r.apis)
	for k := range cfg.pairs {
		p := &pair{
			idx:       k,
			sender:    "s" + strconv.Itoa(k),
			recipient: "r" + strconv.Itoa(k),
			// With several relays the sender sits on another relay than
			// its recipient, so every wake-up crosses replicas.
			pollAPI: r.apis[k%n],
			sendAPI: r.apis[(k+1)%n],
		}
		household := households + strconv.Itoa(k)
		p.senderTok, p.recipientTok = mint(household, p.sender), mint(household, p.recipient)
		r.pairs = append(r.pairs, p)
	}
	r.order = rand.Perm(cfg.pairs)
	return r
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
	start, end  time.Time
	late        int
	refused     map[string]int
	errors      map[string]int
	relay       report.Relay
	undelivered int // still owed when the drain ended
}

func (r *runner) run(ctx context.Context) (*result, error) {
	if err := r.register(ctx); err != nil {
		return nil, err
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
		pollers.Go(func() { r.pollLoop(polls, p, first) })
	}

	sched.start = t0.Add(ramp)
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
	sendLimit := max(1024, r.cfg.pairs+64)
	openLoop(ctx, sched, sendLimit, func(i int, at time.Time) { r.send(ctx, i, at) })
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
	end := time.Now()
	undelivered := r.owed()

	res := &result{cfg: r.cfg, start: sched.start, end: end, undelivered: undelivered}
	if r.meter != nil {
		res.relay = r.meter.read(ctx, cpuStart)
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
	return res, nil
}

func (r *runner) owed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pending
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
		resp, err := p.pollAPI.register(ctx, p.recipientTok)
		if err == nil {
			p.cursor = resp.Cursor
			return nil
		}
		var se *statusError
		if !errors.As(err, &se) || !se.refused() || attempt >= 10 {
			return fmt.Errorf("%s: %w", p.recipient, err)
		}
		sleepFor(ctx, max(se.RetryAfter, 100*time.Millisecond))
	}
}

func (r *runner) send(ctx context.Context, i int, at time.Time) {
	p := r.pairs[r.sends[i].pair]
	id := r.sendID(i)
	req := sendRequest{ID: id, To: []string{p.recipient}, Payload: payload(id, r.cfg.payload)}
	started := time.Now()
	r.mu.Lock()
	rec := &r.sends[i]
	rec.started = started
	r.counts.started++
	if started.Sub(at) > r.cfg.late {
		r.counts.late++
	}
	r.mu.Unlock()

	resp, err := p.sendAPI.send(ctx, p.senderTok, req)
	answered := time.Now()

	r.mu.Lock()
	defer r.mu.Unlock()
	rec.answered = answered
	var se *statusError
	switch {
	case err == nil:
		rec.outcome = accepted
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
	case errors.As(err, &se) && se.refused():
		rec.outcome = refused
		r.counts.refused["send "+se.kind()]++
	case errors.As(err, &se):
		rec.outcome = failed
		r.counts.errors[errKind("send", err)]++
	default:
		rec.outcome = unknown
		r.counts.errors[errKind("send", err)]++
	}
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

// pollOnce makes one poll and records what it returned. It reports
// whether the relay has more waiting.
func (r *runner) pollOnce(ctx context.Context, p *pair, wait int) (more bool, err error) {
	held := r.held.Add(1)
	for {
		peak := r.peak.Load()
		if held <= peak || r.peak.CompareAndSwap(peak, held) {
			break
		}
	}
	resp, err := p.pollAPI.poll(ctx, p.recipientTok, p.cursor, wait)
	r.held.Add(-1)
	at := time.Now()
	if err == nil {
		r.record(p, resp, at)
		return resp.More, nil
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	var se *statusError
	r.mu.Lock()
	switch {
	case errors.As(err, &se) && se.refused():
		r.counts.refused["poll "+se.kind()]++
	default:
		r.counts.errors[errKind("poll", err)]++
	}
	r.mu.Unlock()
	switch {
	case errors.As(err, &se) && se.refused():
		sleepFor(ctx, max(se.RetryAfter, 100*time.Millisecond))
	case errors.As(err, &se) && se.Code == "cursor_ahead":
		p.cursor = se.Head
	case errors.As(err, &se):
		sleepFor(ctx, time.Second) // a faulty relay must not be hammered
	default:
		sleepFor(ctx, 200*time.Millisecond)
	}
	return false, err
}

// record keeps what a poll returned. Only the recipient's goroutine calls
// it, so p needs no lock; the shared tallies do.
func (r *runner) record(p *pair, resp pollResponse, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range resp.Envelopes {
		got := received{send: r.sendIndex(e.ID), id: e.ID, seq: e.Seq, from: e.From, at: at}
		if got.send >= 0 {
			rec := &r.sends[got.send]
			got.payload = string(e.Payload) == string(payload(e.ID, r.cfg.payload))
			if rec.delivered == 0 {
				if rec.outcome == accepted {
					r.pending--
				}
				r.counts.delivered++
				if !rec.started.IsZero() {
					r.progress = append(r.progress, at.Sub(rec.started))
				}
			}
			rec.delivered++
		}
		p.received = append(p.received, got)
	}
	// The relay's cursor is the last seq returned, or the stored cursor
	// when nothing was; either way it is where the next poll acknowledges.
	p.cursor = resp.Cursor
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
			pending := r.pending
			refused, errs := report.Total(c.refused), report.Total(c.errors)
			r.mu.Unlock()
			var p99 string
			if len(sorted) > 0 {
				slices.Sort(sorted)
				p99 = report.Percentile(sorted, 99).Round(time.Millisecond).String()
			}
			rate := float64(c.accepted-lastAccepted) / now.Sub(last).Seconds()
			lastAccepted, last = c.accepted, now
			r.logger.Info("progress",
				"t", now.Sub(t0).Round(time.Second).String(),
				"held", r.held.Load(), "peak_held", r.peak.Load(),
				"sends_per_s", fmt.Sprintf("%.1f", rate),
				"accepted", c.accepted, "delivered", c.delivered, "owed", pending,
				"p99_started_to_returned", p99,
				"late", c.late, "refused", refused, "errors", errs)
		}
	}
}

// sleepUntil waits for t or ctx; it reports whether t was reached.
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
