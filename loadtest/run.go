package main

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/flamenet/relay/loadtest/internal/check"
	"github.com/flamenet/relay/loadtest/internal/driver"
	"github.com/flamenet/relay/loadtest/internal/faults"
	"github.com/flamenet/relay/loadtest/internal/hostile"
	"github.com/flamenet/relay/loadtest/internal/meter"
	"github.com/flamenet/relay/loadtest/internal/schedule"
	"github.com/flamenet/relay/loadtest/internal/tally"
	"github.com/flamenet/relay/loadtest/internal/wait"
	"github.com/flamenet/relay/loadtest/report"
)

// parts are one run's, wired together: the driver that offers the load,
// the tally that records it, and the faults that run beside them.
type parts struct {
	cfg    *config
	rg     *rig
	logger *slog.Logger
	// tag begins the run's send ids and its households' names.
	tag      string
	tally    *tally.Tally
	driver   *driver.Driver
	campaign *faults.Campaign // nil without -faults
	// heldURLs are the relays' metrics, whose fn_held_polls a herd waits
	// on; none: the tester's own count.
	heldURLs []string
}

// wire returns the parts of cfg's run against rg's relays, and notes in
// rep how their connections are spread.
func wire(cfg *config, rg *rig, rep *report.Report, logger *slog.Logger) (*parts, error) {
	cfg.sourceAddrs = sourceAddrs(cfg, rg.urls, rep, logger)
	if cfg.sourceAddrs > 1 {
		rep.Config.SourceAddresses = cfg.sourceAddrs
	}
	p := &parts{cfg: cfg, rg: rg, logger: logger, tag: randomHex(4), heldURLs: cfg.metricsURLs}
	withCampaign := rg.st != nil && rg.svc != nil
	p.tally = tally.New(tally.Config{Logger: logger, Progress: cfg.progress, Late: cfg.late,
		Payload: cfg.payload, Tag: p.tag, Lives: withCampaign})
	var removals driver.Removals
	if withCampaign {
		p.campaign = faults.NewCampaign(faults.CampaignConfig{
			Seed: *cfg.faults, Duration: cfg.duration, Gap: cfg.faultGap, Replicas: rg.st.Replicas(),
			Pairs: cfg.pairs, Kinds: cfg.faultKinds, Command: cfg.command,
		}, rg.st, rg.svc.PG, rg.svc.Redis, p.tally, logger)
		removals = p.campaign
	}
	d, err := driver.New(driver.Config{
		Targets: rg.urls, Key: rg.key, Tag: p.tag, Pairs: cfg.pairs, Wait: cfg.wait,
		Payload: cfg.payload, Codec: cfg.codec, Explicit: cfg.ackMode == "explicit", Stream: cfg.stream,
		SourceAddrs: cfg.sourceAddrs,
		Careful:     len(cfg.crashes) > 0 || p.campaign != nil || rg.fo != nil,
		Expires:     time.Now().Add(time.Duration(cfg.wait)*time.Second + cfg.duration + cfg.drain + time.Hour),
		Seed:        cfg.faults,
		Removals:    removals,
		Hop:         cfg.hop,
	}, p.tally)
	if err != nil {
		return nil, err
	}
	p.driver = d
	if p.campaign != nil {
		p.campaign.Announce()
	}
	if rg.st != nil && cfg.herd {
		p.heldURLs = nil
		for i := range rg.st.Replicas() {
			p.heldURLs = append(p.heldURLs, rg.st.Relay(i).Metrics())
		}
	}
	return p, nil
}

// run runs the load: the recipients register and listen, the sends go out
// on schedule with whatever runs beside them, the drain waits for what is
// owed, and a last sweep collects the rest. It returns what the run
// measured, once the load's connections are closed.
func (p *parts) run(ctx context.Context) (*check.Result, error) {
	defer p.driver.Close()
	if r := p.rg.redis; r != nil {
		bg, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.Loop(bg)
		}()
		defer func() {
			stop()
			<-done
		}()
	}
	res, err := p.offer(ctx)
	if err != nil {
		return nil, err
	}
	if r := p.rg.redis; r != nil {
		res.Redis = r.Summary()
	}
	return res, nil
}

// offer runs the run's phases, from the registrations to the sweep, and
// returns what they measured.
func (p *parts) offer(ctx context.Context) (*check.Result, error) {
	cfg := p.cfg
	if err := p.driver.Register(ctx); err != nil {
		return nil, err
	}
	var rn *hostile.Renewers
	if cfg.renewers > 0 {
		var err error
		if rn, err = hostile.NewRenewers(p.rg.key, p.tag, p.rg.urls[0], cfg.renewers); err != nil {
			return nil, err
		}
		if err := rn.Pair(ctx); err != nil {
			return nil, err
		}
	}
	sched := schedule.New(time.Time{}, cfg.rate, cfg.duration)
	p.tally.Plan(sched.N)

	t0 := time.Now().Add(100 * time.Millisecond)
	ramp := time.Duration(cfg.wait) * time.Second
	if cfg.herd {
		ramp = 0
	}
	stopListening := p.driver.Listen(ctx, t0, ramp)
	defer stopListening()

	sched.Start = t0.Add(ramp)
	p.announce(ramp)
	var herdHeld time.Duration
	if cfg.herd {
		// A herd is a population in step: every poll started at t0, so
		// they expire together for the whole run. The sends start once
		// the population holds, as "N held at R/s" says; the connection
		// storm that forms it is the restart the -crash runs measure.
		var ok bool
		if herdHeld, ok = p.waitHeld(ctx, t0, t0.Add(time.Duration(cfg.wait)*time.Second)); !ok {
			return nil, ctx.Err()
		}
		sched.Start = t0.Add(herdHeld)
	}
	end := sched.Start.Add(cfg.duration)
	p.driver.SetGiveUp(end.Add(cfg.drain))
	p.tally.Schedule(p.driver.PairOf, sched.At)

	bg, stopBG := context.WithCancel(ctx)
	var background sync.WaitGroup
	background.Go(func() { p.tally.ProgressLoop(bg, t0) })
	if m, ok := p.rg.meter.(*meter.Metrics); ok {
		background.Go(func() { m.Loop(bg) })
	}
	var samples *meter.Samples
	if p.rg.meter != nil {
		samples = meter.NewSamples(p.rg.meter, p.tally.Held)
		background.Go(func() { samples.Loop(bg, sched.Start, end) })
	}
	defer func() {
		stopBG()
		background.Wait()
	}()

	if !wait.Until(ctx, sched.Start) {
		return nil, ctx.Err()
	}
	// The relays' wake-ups are read at the moments their CPU time is, so
	// that the two describe one window.
	wakesStart := p.readWakes(ctx)
	defer wakesStart()
	var cpuStart time.Duration
	if p.rg.meter != nil {
		var err error
		if cpuStart, err = p.rg.meter.CPU(ctx); err != nil {
			p.logger.Warn("relay cpu", "err", err)
		}
	}
	p.logger.Info("sending", "sends", sched.N, "rate", cfg.rate, "pairs", cfg.pairs, "held", p.tally.Held())

	faultsDone := p.inflict(ctx, sched.Start)
	var h *hostile.Hostile
	hctx, stopHostile := context.WithCancel(ctx)
	var hostiles sync.WaitGroup
	defer func() {
		stopHostile()
		hostiles.Wait()
	}()
	if cfg.hostile > 0 {
		h = hostile.New(hostile.Config{
			Connections: cfg.hostile, SlowReaders: cfg.slowReaders, Kinds: cfg.hostileKinds,
			Relay: cfg.relay, Targets: p.rg.urls, Key: p.rg.key, Tag: p.tag,
		}, p.tally)
		hostiles.Go(func() { h.Run(hctx, end) })
	}
	var renewing sync.WaitGroup
	if rn != nil {
		renewing.Go(func() { rn.Run(ctx, sched.Start, end) })
	}

	p.driver.Offer(ctx, sched)
	heldEnd := p.tally.HeldAfter(ctx)
	faultsDone()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	drained, err := p.drain(ctx)
	if err != nil {
		return nil, err
	}
	res := &check.Result{
		ExplicitAck: cfg.ackMode == "explicit", Herd: cfg.herd, Rate: cfg.rate, Duration: cfg.duration, LateAfter: cfg.late,
		Start: sched.Start, End: drained, Undelivered: p.tally.Owed(), HeldEnd: heldEnd, HerdHeld: herdHeld,
	}
	if p.rg.meter != nil {
		res.Relay = p.rg.meter.Read(ctx, cpuStart)
	}
	res.Wakes = p.wakesOver(ctx, wakesStart())
	if h != nil {
		// Hostile requests still waiting for the relay to close their
		// connection get until their limit, and no longer.
		waited := make(chan struct{})
		go func() {
			for {
				d := time.Until(h.StopAt(end))
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
		res.Hostile = h.Summary()
	}
	renewing.Wait()
	if rn != nil {
		res.Renewals = rn.Summary(end.Sub(sched.Start), res.Hostile)
	}

	stopListening()
	// Whatever a cancelled poll had in flight is still owed (its cursor
	// was never acknowledged), so one last pass collects it, and anything
	// else the relay holds for these devices.
	p.driver.Sweep(ctx)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	p.tally.Fill(res)
	if p.campaign != nil {
		res.Campaign = p.campaign.Summary(p.tally.ClientCrashes())
	}
	if samples != nil {
		res.Steady = samples.Steady(sched.Start, end)
	}
	return res, nil
}

// wakeURLs returns the metrics URLs of the stack's relays, "" for one that
// is down, or those -metrics-url names; nil unless there are several
// relays, which wake each other through Redis.
func (p *parts) wakeURLs() []string {
	st := p.rg.st
	if st == nil {
		if len(p.cfg.metricsURLs) < 2 {
			return nil
		}
		return p.cfg.metricsURLs
	}
	if st.Replicas() < 2 {
		return nil
	}
	urls := make([]string, st.Replicas())
	for i := range urls {
		if r := st.Relay(i); r != nil {
			urls[i] = r.Metrics()
		}
	}
	return urls
}

// wakesClient scrapes the relays' wake-up series. No keep-alive: two
// scrapes need no pool, and none is left behind.
var wakesClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// readWakes starts reading the relays' wake-up series and returns what
// waits for the readings, none without several relays. It does not wait
// itself, so that no send is late for it.
func (p *parts) readWakes(ctx context.Context) (wait func() []meter.WakeReading) {
	urls := p.wakeURLs()
	var readings []meter.WakeReading
	var wg sync.WaitGroup
	if urls != nil {
		wg.Go(func() { readings = meter.ReadWakes(ctx, wakesClient, urls) })
	}
	return func() []meter.WakeReading {
		wg.Wait()
		return readings
	}
}

// wakesOver reads the relays' wake-up series again and returns each
// relay's since start; nil when neither reading of any relay could be
// read. What could not be read is absent, and the run goes on.
func (p *parts) wakesOver(ctx context.Context, start []meter.WakeReading) []report.RelayWakes {
	if start == nil {
		return nil
	}
	end := p.readWakes(ctx)()
	var out []report.RelayWakes
	read := false
	for i := range min(len(start), len(end)) {
		for _, r := range []struct {
			at      string
			reading meter.WakeReading
		}{{"start", start[i]}, {"end", end[i]}} {
			if r.reading.Err != nil {
				p.logger.Warn("a relay's wake-up metrics cannot be read; they are absent from the report",
					"relay", i, "at", r.at, "err", r.reading.Err)
			} else {
				read = true
			}
		}
		w, restarted := meter.WakesOver(i, start[i], end[i])
		if restarted {
			p.logger.Warn("a relay restarted in the window; its wake-up counters are absent from the report", "relay", i)
		}
		out = append(out, w)
	}
	if !read {
		return nil
	}
	return out
}

// inflict starts the faults the run asks for, from start, the first
// scheduled send, and returns a function that waits until they have
// healed.
func (p *parts) inflict(ctx context.Context, start time.Time) (wait func()) {
	cfg := p.cfg
	var loops sync.WaitGroup
	if len(cfg.crashes) > 0 && p.rg.st != nil {
		plan := faults.CrashPlan{At: cfg.crashes, Replica: cfg.crashReplica, Down: cfg.crashDown, AckInterval: cfg.relay.AckInterval}
		loops.Go(func() { faults.CrashLoop(ctx, start, plan, p.rg.st, p.tally, p.logger) })
	}
	if p.campaign != nil {
		loops.Go(func() { p.campaign.Run(ctx, start, p.driver) })
	}
	if p.rg.fo != nil {
		loops.Go(func() { p.rg.fo.Loop(ctx, start, len(p.rg.urls), p.tally, p.logger) })
	}
	return loops.Wait
}

// drain waits for every accepted send to come back, at most -drain, and
// returns when it stopped waiting.
func (p *parts) drain(ctx context.Context) (time.Time, error) {
	deadline := time.Now().Add(p.cfg.drain)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for p.tally.Owed() > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-tick.C:
		}
	}
	return time.Now(), nil
}

// announce says, before anything is sent, how long the run will take and
// why: polls first, for a ramp with no sends, then the sends, then up to
// the drain for what is still owed.
func (p *parts) announce(ramp time.Duration) {
	cfg := p.cfg
	why := "the first polls spread over one wait period (-wait) so that they expire as a settled population's do, with no sends"
	if cfg.herd {
		ramp = time.Duration(cfg.wait) * time.Second
		why = "every poll starts at once (-herd); the sends start as soon as all are held, at most one wait period (-wait) later"
	}
	p.logger.Info("plan: polls first, then sends, then the drain",
		"ramp", ramp.String(), "ramp_why", why, "sends", cfg.duration.String(),
		"drain_at_most", cfg.drain.String(), "about", (ramp + cfg.duration).Round(time.Second).String(),
		"at_most", (ramp + cfg.duration + cfg.drain).Round(time.Second).String())
}

// waitHeld waits until every recipient holds a poll, or until deadline,
// and says how long after t0 that was. A poll is held once the tester has
// sent it and, where the relays' metrics can be read, once the relays'
// fn_held_polls counts it: a request in flight may not have reached its
// relay yet. It reports false only when ctx ends.
func (p *parts) waitHeld(ctx context.Context, t0, deadline time.Time) (time.Duration, bool) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	urls := p.heldURLs
	var scraped time.Time
	for {
		now := time.Now()
		held := p.tally.Held() >= p.cfg.pairs
		if held && len(urls) > 0 {
			held = false
			// A scrape costs the relays a gather of their registry, while
			// they take the population's storm: no more than one in 50 ms.
			if now.Sub(scraped) >= 50*time.Millisecond {
				scraped = now
				n, err := meter.RelaysHeld(ctx, hc, urls)
				if err != nil {
					p.logger.Warn("the relays' held polls cannot be read; the tester's count decides", "err", err)
					urls = nil
				}
				held = err != nil || n >= p.cfg.pairs
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
