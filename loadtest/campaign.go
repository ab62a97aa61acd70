package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/loadtest/report"
	"github.com/flamenet/relay/token"
)

// A fault campaign (-faults SEED) runs the ordinary load against relays on
// a Postgres and a Redis of its own, and meanwhile kills, pauses and
// restarts them, removes recipients and registers them again with fresh
// tokens, and crashes recipients' clients, all on a schedule the seed
// draws. The load's checks judge every accepted send by the recipient's
// registrations ("lives") it overlapped; the campaign adds what a removal
// promises: the old token is refused everywhere and re-creates nothing.

// The kinds of fault a campaign draws from.
const (
	faultRelayKill   = "relay-kill"   // SIGKILL a relay; restart it after the hold
	faultRelayPause  = "relay-pause"  // SIGSTOP a relay; SIGCONT after the hold
	faultPGKill      = "pg-kill"      // SIGKILL every Postgres process; restart after the hold
	faultPGPause     = "pg-pause"     // SIGSTOP every Postgres process; SIGCONT after the hold
	faultRedisKill   = "redis-kill"   // SIGKILL Redis; restart it, empty, after the hold
	faultRedisPause  = "redis-pause"  // SIGSTOP Redis; SIGCONT after the hold
	faultRemove      = "remove"       // an admin removes a recipient; it registers again after the hold
	faultClientCrash = "client-crash" // a recipient's client dies before it acknowledges what it got
)

// faultKinds are every kind, in the order -fault-kinds lists them.
var faultKinds = []string{faultRelayKill, faultRelayPause, faultPGKill, faultPGPause,
	faultRedisKill, faultRedisPause, faultRemove, faultClientCrash}

// faultShape is how long a kind's hold is drawn (uniformly, to the
// millisecond), and how long after it the planner leaves its target alone:
// a restart's boot, a removal's checks and registration.
var faultShape = map[string]struct{ min, max, settle time.Duration }{
	faultRelayKill:  {0, 2 * time.Second, 2 * time.Second},
	faultRelayPause: {200 * time.Millisecond, 4 * time.Second, 0},
	faultPGKill:     {0, 2 * time.Second, 3 * time.Second},
	// Past FN_STORE_TIMEOUT (5 s) at times, so that requests fail as well
	// as stall.
	faultPGPause:     {200 * time.Millisecond, 6 * time.Second, 0},
	faultRedisKill:   {0, 3 * time.Second, time.Second},
	faultRedisPause:  {200 * time.Millisecond, 6 * time.Second, 0},
	faultRemove:      {time.Second, 3 * time.Second, 3 * time.Second},
	faultClientCrash: {0, time.Second, 0},
}

// faultWeight is how often a kind is drawn against the others (1 unless
// named): removals are cheap and the race they start is what the relays
// most often get wrong, and a client crash needs envelopes on their way.
var faultWeight = map[string]int{faultRemove: 3, faultClientCrash: 2}

// Streams of the seed: the plan and the order of the sends draw apart, so
// that a change to one leaves the other as it was.
const (
	seedPlan  = 0x706c616e // "plan"
	seedOrder = 0x6f726472 // "ordr"
)

// faultGrace is how long after a fault healed a failed request is still
// put down to it: a relay's pool finds its dead connections to a
// restarted Postgres one request at a time.
const faultGrace = 3 * time.Second

// fault is one planned event.
type fault struct {
	At     time.Duration // after the first scheduled send
	Kind   string
	Target int           // the relay, or the pair whose recipient; -1 for Postgres and Redis
	Hold   time.Duration // down, paused, or from the removal's answer to the registration
	// A removal's relays: the DELETE goes to Via; the old token's poll to
	// Stale and its ack to the next relay; the directory read and the new
	// registration to Register.
	Via, Stale, Register int
}

func (f fault) String() string {
	s := fmt.Sprintf("%.3fs %-12s", f.At.Seconds(), f.Kind)
	switch f.Kind {
	case faultRelayKill, faultRelayPause:
		s += fmt.Sprintf(" relay %d", f.Target)
	case faultRemove:
		s += fmt.Sprintf(" r%d via %d, old token at %d, registered at %d,", f.Target, f.Via, f.Stale, f.Register)
	case faultClientCrash:
		s += fmt.Sprintf(" r%d", f.Target)
	}
	return s + " hold " + f.Hold.String()
}

// component is what the fault acts on; faults of one component run one
// after another.
func (f fault) component() string {
	switch f.Kind {
	case faultRelayKill, faultRelayPause:
		return "relay " + strconv.Itoa(f.Target)
	case faultPGKill, faultPGPause:
		return "postgres"
	case faultRedisKill, faultRedisPause:
		return "redis"
	default:
		return "pair " + strconv.Itoa(f.Target)
	}
}

// planParams are what a plan depends on: the same params give the same
// plan.
type planParams struct {
	seed            uint64
	duration, gap   time.Duration
	replicas, pairs int
	kinds           []string
}

// planFaults draws a campaign: faults start a mean gap apart (exponential
// gaps), each of a kind (as often as its weight), target and hold drawn
// from the seed. A fault whose component is still busy with the one
// before waits for it; one that would not be over two seconds before the
// sends end is left out, so that the drain sees a healed stack. Every
// draw is made whether or not the fault is kept, so that the plan
// depends on nothing else.
func planFaults(p planParams) []fault {
	rng := rand.New(rand.NewPCG(p.seed, seedPlan))
	var bag []string // each kind as often as its weight
	for _, k := range p.kinds {
		for range max(faultWeight[k], 1) {
			bag = append(bag, k)
		}
	}
	busy := map[string]time.Duration{}
	end := p.duration - 2*time.Second
	var out []fault
	for t := time.Second; ; {
		t += time.Duration(rng.ExpFloat64() * float64(p.gap))
		if t >= end {
			break
		}
		f := fault{Kind: bag[rng.IntN(len(bag))], Target: -1}
		shape := faultShape[f.Kind]
		f.Hold = shape.min + time.Duration(rng.Int64N(int64((shape.max-shape.min)/time.Millisecond)+1))*time.Millisecond
		relay, pair := rng.IntN(p.replicas), rng.IntN(p.pairs)
		via, stale, register := rng.IntN(p.replicas), rng.IntN(p.replicas), rng.IntN(p.replicas)
		switch f.Kind {
		case faultRelayKill, faultRelayPause:
			f.Target = relay
		case faultRemove:
			f.Target, f.Via, f.Stale, f.Register = pair, via, stale, register
		case faultClientCrash:
			f.Target = pair
		}
		c := f.component()
		f.At = max(t, busy[c])
		if f.At+f.Hold+shape.settle > end {
			continue
		}
		busy[c] = f.At + f.Hold + shape.settle
		out = append(out, f)
	}
	slices.SortStableFunc(out, func(a, b fault) int { return int(a.At - b.At) })
	return out
}

// campaign is a run's fault campaign.
type campaign struct {
	seed uint64
	plan []fault
	svc  *services
	// replay is the command that runs the same campaign again.
	replay string

	// Guarded by the runner's mu.
	results    []report.Fault // one per planned fault
	violations map[string]int
	examples   []string
	stale      map[string]int // the removal checks' answers, by kind
}

func newCampaign(cfg *config, replicas int, svc *services) *campaign {
	plan := planFaults(planParams{seed: *cfg.faults, duration: cfg.duration, gap: cfg.faultGap,
		replicas: replicas, pairs: cfg.pairs, kinds: cfg.faultKinds})
	c := &campaign{seed: *cfg.faults, plan: plan, svc: svc, replay: replayCommand(cfg.command),
		results: make([]report.Fault, len(plan)), violations: map[string]int{}, stale: map[string]int{}}
	for i, f := range plan {
		c.results[i] = report.Fault{AtSeconds: round3(f.At.Seconds()), Kind: f.Kind, Target: f.Target,
			HoldMS: float64(f.Hold.Milliseconds()), Plan: f.String()}
	}
	return c
}

// replayCommand is the invocation without the flags that only name where
// a report goes.
func replayCommand(command []string) string {
	var out []string
	skip := false
	for _, a := range command {
		if skip {
			skip = false
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && (name == "out" || name == "name") {
			skip = !hasValue
			continue
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

// announce prints the seed and the plan, so that any run can be replayed.
func (c *campaign) announce(logger *slog.Logger) {
	logger.Info("fault campaign", "seed", c.seed, "faults", len(c.plan), "replay", c.replay)
	for _, f := range c.plan {
		logger.Info("planned fault", "fault", f.String())
	}
}

// violateLocked records a broken promise; the caller holds mu. The first
// few of each kind are kept as examples.
func (r *runner) violateLocked(kind, example string) {
	c := r.campaign
	c.violations[kind]++
	if c.violations[kind] <= 3 {
		c.examples = append(c.examples, kind+": "+example)
	}
}

// staleGrace is how long after a removal's 204 another relay may still
// accept the old token while wake-ups flow: PROTOCOL.md lets a relay
// that has not heard of the removal judge the token from memory, and the
// news travels with the wake-ups, normally within milliseconds.
const staleGrace = time.Second

// staleAnswerLocked checks a request of p's life l, made at asked to relay
// i, that the relay accepted. After the removal was answered, the old
// token must be refused as soon as the removal can have reached relay i:
// staleGrace after the 204, or after the end of a fault (of relay i,
// Postgres or Redis, with its grace) that delayed the news. What a stale token could do before then, create
// or register the device, receive another life's envelopes, the
// directory and delivery checks judge. The caller holds mu.
func (r *runner) staleAnswerLocked(p *pair, l *life, op string, i int, asked time.Time) {
	if r.campaign == nil || l.removed.IsZero() || !asked.After(l.removed) {
		return
	}
	if !asked.After(r.windowsEnd(i, l.removed, asked).Add(staleGrace)) {
		r.counts.removal[op+" 2xx before the removal reached the relay"]++
		return
	}
	r.violateLocked("old token accepted after its removal had time to reach the relay", fmt.Sprintf("%s's %s at relay %d, sent %.3f s into the sends and %s after the removal's 204, was accepted",
		p.recipient, op, i, asked.Sub(r.start).Seconds(), asked.Sub(l.removed).Round(time.Microsecond)))
}

// removalAnswer reports whether err is the 401 that a removal of l, begun
// before at, explains; it counts it as such.
func (r *runner) removalAnswer(l *life, op string, err error, at time.Time) bool {
	var se *client.Error
	if !errors.As(err, &se) || se.Status != http.StatusUnauthorized {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !l.ended() || at.Before(l.removing) {
		return false
	}
	r.counts.removal[op+" "+kind(se)]++
	return true
}

// awaitLife waits until a life after li begins, or ctx ends.
func (r *runner) awaitLife(ctx context.Context, p *pair, li int) {
	r.mu.Lock()
	next, begun := p.nextLife, len(p.lives)-1 > li
	r.mu.Unlock()
	if begun {
		return
	}
	select {
	case <-next:
	case <-ctx.Done():
	}
}

// crashClient crashes the recipient's client if a crash is armed: it has
// received envelopes and dies before it acknowledges them, so that it
// restarts without its place and asks the relay, which hands them again.
// It reports whether it crashed.
func (r *runner) crashClient(ctx context.Context, p *pair) bool {
	select {
	case down := <-p.crash:
		r.mu.Lock()
		p.crashes = append(p.crashes, time.Now())
		r.mu.Unlock()
		p.lostPlace = true
		sleepFor(ctx, down)
		return true
	default:
		return false
	}
}

// campaignLoop inflicts the plan, each component's faults one after
// another, and returns when every fault has healed.
func (r *runner) campaignLoop(ctx context.Context, start time.Time) {
	c := r.campaign
	byComponent := map[string][]int{}
	var components []string
	for i, f := range c.plan {
		k := f.component()
		if _, ok := byComponent[k]; !ok {
			components = append(components, k)
		}
		byComponent[k] = append(byComponent[k], i)
	}
	var wg sync.WaitGroup
	for _, k := range components {
		wg.Go(func() {
			for _, i := range byComponent[k] {
				if !sleepUntil(ctx, start.Add(c.plan[i].At)) {
					return
				}
				r.inflict(ctx, start, i)
			}
		})
	}
	wg.Wait()
}

// inflict runs planned fault i and records when it began and healed.
func (r *runner) inflict(ctx context.Context, start time.Time, i int) {
	f := r.campaign.plan[i]
	sv := r.campaign.svc
	began := time.Now()
	r.logger.Info("fault", "fault", f.String())
	var healed time.Time
	var err error
	switch f.Kind {
	case faultRelayKill:
		healed, err = r.outage(ctx, []int{f.Target}, func() error {
			killed, ready, err := r.stack.crash(ctx, f.Target, f.Hold)
			if !killed.IsZero() {
				// What the relay had not yet written of its acks is lost.
				r.mu.Lock()
				r.kills = append(r.kills, killed)
				r.mu.Unlock()
			}
			if err == nil && ready.IsZero() {
				err = errors.New("did not come back")
			}
			return err
		})
	case faultRelayPause:
		healed, err = r.outage(ctx, []int{f.Target}, func() error {
			return r.stack.pause(ctx, f.Target, f.Hold)
		})
	case faultPGKill:
		healed, err = r.outage(ctx, nil, func() error { return restart(ctx, sv.pg, f.Hold) })
	case faultPGPause:
		healed, err = r.outage(ctx, nil, func() error { return freeze(ctx, sv.pg, f.Hold) })
	case faultRedisKill:
		healed, err = r.outage(ctx, nil, func() error { return restart(ctx, sv.redis, f.Hold) })
	case faultRedisPause:
		healed, err = r.outage(ctx, nil, func() error { return freeze(ctx, sv.redis, f.Hold) })
	case faultRemove:
		err = r.removeAndReturn(ctx, f)
		healed = time.Now()
	case faultClientCrash:
		select {
		case r.pairs[f.Target].crash <- f.Hold:
		default: // one is armed already
		}
		healed = began
	}
	if err != nil && ctx.Err() == nil {
		r.logger.Error("fault", "fault", f.String(), "err", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	res := &r.campaign.results[i]
	res.StartedSeconds = round3(began.Sub(start).Seconds())
	res.HealedSeconds = round3(healed.Sub(start).Seconds())
	if err != nil {
		res.Error = err.Error()
	}
}

// outage opens a fault window over relays (nil: every relay, as a store or
// Redis fault reaches them all), runs fault, and closes the window
// faultGrace after it returns.
func (r *runner) outage(ctx context.Context, relays []int, fault func() error) (time.Time, error) {
	if relays == nil {
		for i := range r.stack.replicas() {
			relays = append(relays, i)
		}
	}
	w := r.openWindow(time.Now(), relays)
	err := fault()
	healed := time.Now()
	r.mu.Lock()
	r.windows[w].to = healed.Add(faultGrace)
	r.windows[w].retryableOnly = true
	r.mu.Unlock()
	return healed, err
}

// restart kills a service and starts it again after down.
func restart(ctx context.Context, s *service, down time.Duration) error {
	if err := s.kill(); err != nil {
		return err
	}
	sleepFor(ctx, down)
	// Started even when the run is ending: the teardown stops it cleanly.
	return s.start(context.WithoutCancel(ctx))
}

// freeze pauses a service for hold. It is resumed whatever happens.
func freeze(ctx context.Context, s *service, hold time.Duration) error {
	if err := s.pause(); err != nil {
		return err
	}
	sleepFor(ctx, hold)
	return s.resume()
}

// removeAndReturn removes the pair's recipient with an admin token, checks
// that its old token is refused at other relays and re-creates nothing,
// and after the hold registers it again with a fresh token: its next life.
func (r *runner) removeAndReturn(ctx context.Context, f fault) error {
	p := r.pairs[f.Target]
	n := len(r.targets)
	admin := r.mint(p.household, "admin", token.ScopeAdmin, time.Now())
	r.mu.Lock()
	old := p.lives[len(p.lives)-1]
	old.removing = time.Now()
	r.mu.Unlock()

	status, _, err := r.untilAnswered(ctx, func(ctx context.Context) (int, []byte, error) {
		return r.call(ctx, f.Via, http.MethodDelete, "/v1/devices/"+p.recipient, admin)
	})
	removed := time.Now()
	r.mu.Lock()
	old.removed = removed
	// 404 only when an earlier attempt committed and its answer was lost.
	if err == nil && status != http.StatusNoContent && status != http.StatusNotFound {
		// Refused: the life goes on, and the failed fault fails the run.
		old.removing, old.removed = time.Time{}, time.Time{}
		err = fmt.Errorf("answered %d", status)
	}
	r.mu.Unlock()
	if err != nil {
		return fmt.Errorf("remove %s: %w", p.recipient, err)
	}

	// The old token at once, at every relay, while some may not have heard
	// of the removal yet: refused, and the device not made again (the
	// directory says, below).
	var probes sync.WaitGroup
	for j := range n {
		probes.Go(func() { r.staleCheck(ctx, p, old, (f.Stale+j)%n, staleProbes[j%len(staleProbes)]) })
	}
	probes.Wait()
	if !sleepUntil(ctx, removed.Add(f.Hold)) {
		return ctx.Err()
	}
	r.directoryCheck(ctx, p, f.Register, admin)

	// iat after the removal, which the relay keeps to the microsecond and
	// the token to the second.
	tok := r.mint(p.household, p.recipient, token.ScopeDevice, removed.Truncate(time.Second).Add(time.Second))
	pollClient, err := client.New(r.targets[p.pollRelay], tok, r.opts...)
	if err != nil {
		return err
	}
	regClient, err := client.New(r.targets[f.Register], tok, r.opts...)
	if err != nil {
		return err
	}
	l := newLife(tok, pollClient)
	l.registering = time.Now()
	var reg client.Registration
	for attempt := 0; ; attempt++ {
		reg, err = regClient.Register(ctx)
		if err == nil || !retryable(err) || ctx.Err() != nil {
			break
		}
		sleepFor(ctx, retryWait(attempt, err))
	}
	l.registered = time.Now()
	if err != nil {
		// Installed all the same, so that what follows is judged: a device
		// that did not come back owes nothing but must not receive.
		err = fmt.Errorf("register %s again: %w", p.recipient, err)
	}
	l.cursor, l.epoch = reg.Cursor, reg.Epoch

	r.mu.Lock()
	if err == nil && reg.Cursor != 0 {
		r.violateLocked("a registration after a removal did not start over", fmt.Sprintf("%s registered again at relay %d, %.3f s into the sends, with cursor %d, want 0",
			p.recipient, f.Register, l.registering.Sub(r.start).Seconds(), reg.Cursor))
	}
	p.lives = append(p.lives, l)
	close(p.nextLife)
	p.nextLife = make(chan struct{})
	r.mu.Unlock()
	old.end()
	return err
}

// staleProbes are the requests a removed life's token makes right after
// the removal, one per relay: a poll and an ack of cursor 0, and a poll
// whose cursor is far above any head, which a relay that has not heard of
// the removal takes to the store (where the device is gone).
var staleProbes = []string{"poll", "ack", "poll ahead"}

// farAhead is the cursor of a "poll ahead" probe.
const farAhead = 1 << 40

// staleCheck makes one stale probe with a removed life's token at relay i
// and wants 401. A relay that has not heard of the removal yet may accept
// the token (a 2xx, or 409 cursor_ahead for the poll ahead), as
// staleAnswerLocked judges.
func (r *runner) staleCheck(ctx context.Context, p *pair, l *life, i int, op string) {
	c, err := client.New(r.targets[i], l.token, r.opts...)
	if err != nil {
		return
	}
	asked := time.Now()
	err = r.untilDefinitive(ctx, func(ctx context.Context) error {
		asked = time.Now()
		switch op {
		case "ack":
			return c.Ack(ctx, client.Position{})
		case "poll ahead":
			_, err := c.Poll(ctx, client.PollQuery{Cursor: farAhead})
			return err
		default:
			_, err := c.Poll(ctx, client.PollQuery{Cursor: 0})
			return err
		}
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	var se *client.Error
	switch {
	case err == nil || op == "poll ahead" && errors.As(err, &se) && se.CursorAhead():
		r.campaign.stale[op+" accepted"]++
		r.staleAnswerLocked(p, l, op, i, asked)
	case errors.As(err, &se) && se.Status == http.StatusUnauthorized:
		r.campaign.stale[op+" 401"]++
	case errors.As(err, &se):
		r.campaign.stale[op+" "+kind(se)]++
		r.violateLocked("old token not refused with 401 after its removal", fmt.Sprintf("%s's %s at relay %d, %.3f s into the sends: %v", p.recipient, op, i, asked.Sub(r.start).Seconds(), err))
	default:
		// No answer before the run ended: nothing learnt.
		r.campaign.stale[op+" unanswered"]++
	}
}

// directoryCheck reads the household's directory at relay i, before the
// recipient registers again: a removed device listed there was made again
// by something, most likely its old token.
func (r *runner) directoryCheck(ctx context.Context, p *pair, i int, admin string) {
	status, body, err := r.untilAnswered(ctx, func(ctx context.Context) (int, []byte, error) {
		return r.call(ctx, i, http.MethodGet, "/v1/devices?limit=1000", admin)
	})
	var dir struct {
		Devices []struct {
			Device       string `json:"device"`
			RegisteredAt string `json:"registered_at"`
		} `json:"devices"`
	}
	if err == nil && status == http.StatusOK {
		err = json.Unmarshal(body, &dir)
	} else if err == nil {
		err = fmt.Errorf("answered %d", status)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.campaign.stale["directory unread"]++
		if ctx.Err() == nil {
			r.violateLocked("directory not readable", fmt.Sprintf("at relay %d: %v", i, err))
		}
		return
	}
	r.campaign.stale["directory read"]++
	for _, d := range dir.Devices {
		if d.Device == p.recipient {
			r.violateLocked("a removed device was listed again before it registered again",
				fmt.Sprintf("%s listed by relay %d, %.3f s into the sends, registered_at %s, after its removal and before its new token registered",
					p.recipient, i, time.Since(r.start).Seconds(), d.RegisteredAt))
		}
	}
}

// untilDefinitive repeats call while it gets no definitive answer (none,
// or 503), as a careful client would, until the drain ends.
func (r *runner) untilDefinitive(ctx context.Context, call func(context.Context) error) error {
	for attempt := 0; ; attempt++ {
		err := call(ctx)
		if err == nil || !retryable(err) || ctx.Err() != nil || time.Now().After(r.giveUp) {
			return err
		}
		sleepFor(ctx, retryWait(attempt, err))
	}
}

// untilAnswered is untilDefinitive for a plain request.
func (r *runner) untilAnswered(ctx context.Context, call func(context.Context) (int, []byte, error)) (status int, body []byte, err error) {
	err = r.untilDefinitive(ctx, func(ctx context.Context) error {
		status, body, err = call(ctx)
		if err == nil && status == http.StatusServiceUnavailable {
			return &client.Error{Status: status}
		}
		return err
	})
	return status, body, err
}

// call makes one request the client package has no call for (an admin's
// removal, the directory) to relay i.
func (r *runner) call(ctx context.Context, i int, method, path, tok string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, r.targets[i]+path, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := r.tr.RoundTrip(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body, err
}

// summary is the campaign's part of the report.
func (c *campaign) summary(crashes int) *report.Campaign {
	out := &report.Campaign{
		Seed:          strconv.FormatUint(c.seed, 10),
		Replay:        c.replay,
		Faults:        c.results,
		ClientCrashes: crashes,
		StaleChecks:   c.stale,
		Violations:    c.violations,
		Examples:      c.examples,
	}
	for _, f := range c.plan {
		if f.Kind == faultRemove {
			out.Removals++
		}
	}
	return out
}

// campaignFailures are a campaign's own reasons to fail: each kind of
// broken promise, with its first example, and each fault that did not
// heal.
func campaignFailures(c *report.Campaign) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(c.Violations)) {
		line := fmt.Sprintf("%s: %d times", k, c.Violations[k])
		for _, e := range c.Examples {
			if ex, ok := strings.CutPrefix(e, k+": "); ok {
				line += "; first: " + ex
				break
			}
		}
		out = append(out, line)
	}
	for _, f := range c.Faults {
		if f.Error != "" {
			out = append(out, fmt.Sprintf("the fault planned at %.3f s (%s) failed: %s", f.AtSeconds, f.Plan, f.Error))
		}
	}
	return out
}
