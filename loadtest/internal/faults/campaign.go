package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/loadtest/internal/answer"
	"github.com/flamenet/relay/loadtest/internal/check"
	"github.com/flamenet/relay/loadtest/internal/wait"
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

// FaultKinds are every kind, in the order -fault-kinds lists them.
var FaultKinds = []string{faultRelayKill, faultRelayPause, faultPGKill, faultPGPause,
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

// seedPlan is the stream of the seed the plan draws from; the order of the
// sends draws from another (the driver's), so that a change to one leaves
// the other as it was.
const seedPlan = 0x706c616e // "plan"

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

// Load is what a campaign needs of the load it runs beside: its pairs,
// tokens and clients of its issuer, and its recipients' lives.
type Load interface {
	// Pair returns pair i's household, its recipient's device, and the
	// relay the recipient polls.
	Pair(i int) (household, recipient string, pollRelay int)
	// Mint issues a token of the load's issuer.
	Mint(household, device, scope string, issued time.Time) string
	// Client returns a client that speaks to relay i with tok.
	Client(i int, tok string) (*client.Client, error)
	// Call makes one request the client package has no call for to
	// relay i.
	Call(ctx context.Context, i int, method, path, tok string) (int, []byte, error)
	// Token returns the token of life li of pair's recipient.
	Token(pair, li int) string
	// ArmCrash crashes pair's recipient's client the next time it
	// receives envelopes, for down.
	ArmCrash(pair int, down time.Duration)
	// Begin begins pair's recipient's next life, l, registered with tok
	// at cursor in epoch; c polls with it.
	Begin(pair int, l *check.Life, tok string, c *client.Client, cursor int64, epoch string)
	// GiveUp returns when a careful client stops retrying: the drain's
	// end.
	GiveUp() time.Time
}

// Tally is what a campaign needs of the run's tally: windows in which its
// faults excuse failures, the record of kills and of the recipients'
// lives, and the answers its removals explain.
type Tally interface {
	Windows
	// WindowsEnd returns the latest end of the windows of relay that
	// overlap [from, to], or from when none does.
	WindowsEnd(relay int, from, to time.Time) time.Time
	// Killed records that a relay was killed at the time given.
	Killed(at time.Time)
	// CountRemoval counts an answer of kind that a removal explains.
	CountRemoval(kind string)
	// BeginRemoval records that the removal of pair's recipient's latest
	// life began at the time given, and returns that life's index.
	BeginRemoval(pair int, at time.Time) int
	// RemovalAnswered records that the removal of life li of pair was
	// answered at the time given, or given up on; refused: the life goes
	// on.
	RemovalAnswered(pair, li int, at time.Time, refused bool)
	// RemovedAt returns when the removal of life li of pair was answered;
	// zero while it lasts.
	RemovedAt(pair, li int) time.Time
}

// Service is a server of the campaign's own, Postgres or Redis.
type Service interface {
	Kill() error
	Start(ctx context.Context) error
	Pause() error
	Resume() error
}

// CampaignConfig is what a campaign's plan is drawn from, and the command
// that replays it.
type CampaignConfig struct {
	Seed     uint64
	Duration time.Duration // the offered duration
	Gap      time.Duration // the mean gap between two faults' starts
	Replicas int
	Pairs    int
	Kinds    []string
	Command  []string // the invocation
}

// Campaign is a run's fault campaign.
type Campaign struct {
	seed uint64
	plan []fault
	// replay is the command that runs the same campaign again.
	replay    string
	relays    Relays
	pg, redis Service
	tally     Tally
	logger    *slog.Logger

	mu sync.Mutex
	// start is the first scheduled send, once Run has begun.
	start      time.Time
	results    []report.Fault // one per planned fault
	violations map[string]int
	examples   []string
	stale      map[string]int // the removal checks' answers, by kind
}

// NewCampaign returns the campaign cfg plans against relays and the
// servers pg and redis, recording in tally.
func NewCampaign(cfg CampaignConfig, relays Relays, pg, redis Service, tally Tally, logger *slog.Logger) *Campaign {
	plan := planFaults(planParams{seed: cfg.Seed, duration: cfg.Duration, gap: cfg.Gap,
		replicas: cfg.Replicas, pairs: cfg.Pairs, kinds: cfg.Kinds})
	c := &Campaign{seed: cfg.Seed, plan: plan, replay: replayCommand(cfg.Command),
		relays: relays, pg: pg, redis: redis, tally: tally, logger: logger,
		results: make([]report.Fault, len(plan)), violations: map[string]int{}, stale: map[string]int{}}
	for i, f := range plan {
		c.results[i] = report.Fault{AtSeconds: round3(f.At.Seconds()), Kind: f.Kind, Target: f.Target,
			HoldMS: float64(f.Hold.Milliseconds()), Plan: f.String()}
	}
	return c
}

// replayCommand returns the invocation without the flags that only name
// where a report goes.
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

// Announce logs the seed and the plan, so that any run can be replayed.
func (c *Campaign) Announce() {
	c.logger.Info("fault campaign", "seed", c.seed, "faults", len(c.plan), "replay", c.replay)
	for _, f := range c.plan {
		c.logger.Info("planned fault", "fault", f.String())
	}
}

// violateLocked records a broken promise; the caller holds mu. The first
// few of each kind are kept as examples.
func (c *Campaign) violateLocked(kind, example string) {
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

// Accepted checks a request of life li of pair (whose recipient is the
// device named), made at asked to relay i, that the relay accepted. After
// the removal was answered, the old token must be refused as soon as the
// removal can have reached relay i: staleGrace after the 204, or after the
// end of a fault (of relay i, Postgres or Redis, with its grace) that
// delayed the news. What a stale token could do before then, create or
// register the device, receive another life's envelopes, the directory
// and delivery checks judge.
func (c *Campaign) Accepted(pair, li int, recipient, op string, i int, asked time.Time) {
	removed := c.tally.RemovedAt(pair, li)
	if removed.IsZero() || !asked.After(removed) {
		return
	}
	if !asked.After(c.tally.WindowsEnd(i, removed, asked).Add(staleGrace)) {
		c.tally.CountRemoval(op + " 2xx before the removal reached the relay")
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.violateLocked("old token accepted after its removal had time to reach the relay", fmt.Sprintf("%s's %s at relay %d, sent %.3f s into the sends and %s after the removal's 204, was accepted",
		recipient, op, i, asked.Sub(c.start).Seconds(), asked.Sub(removed).Round(time.Microsecond)))
}

// Run inflicts the plan on load, whose first send was scheduled at start,
// each component's faults one after another, and returns when every fault
// has healed.
func (c *Campaign) Run(ctx context.Context, start time.Time, load Load) {
	c.mu.Lock()
	c.start = start
	c.mu.Unlock()
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
				if !wait.Until(ctx, start.Add(c.plan[i].At)) {
					return
				}
				c.inflict(ctx, start, load, i)
			}
		})
	}
	wg.Wait()
}

// inflict runs planned fault i and records when it began and healed.
func (c *Campaign) inflict(ctx context.Context, start time.Time, load Load, i int) {
	f := c.plan[i]
	began := time.Now()
	c.logger.Info("fault", "fault", f.String())
	var healed time.Time
	var err error
	switch f.Kind {
	case faultRelayKill:
		healed, err = c.outage(ctx, []int{f.Target}, func() error {
			killed, ready, err := c.relays.Crash(ctx, f.Target, f.Hold)
			if !killed.IsZero() {
				// What the relay had not yet written of its acks is lost.
				c.tally.Killed(killed)
			}
			if err == nil && ready.IsZero() {
				err = errors.New("did not come back")
			}
			return err
		})
	case faultRelayPause:
		healed, err = c.outage(ctx, []int{f.Target}, func() error {
			return c.relays.Pause(ctx, f.Target, f.Hold)
		})
	case faultPGKill:
		healed, err = c.outage(ctx, nil, func() error { return restart(ctx, c.pg, f.Hold) })
	case faultPGPause:
		healed, err = c.outage(ctx, nil, func() error { return freeze(ctx, c.pg, f.Hold) })
	case faultRedisKill:
		healed, err = c.outage(ctx, nil, func() error { return restart(ctx, c.redis, f.Hold) })
	case faultRedisPause:
		healed, err = c.outage(ctx, nil, func() error { return freeze(ctx, c.redis, f.Hold) })
	case faultRemove:
		err = c.removeAndReturn(ctx, load, f)
		healed = time.Now()
	case faultClientCrash:
		load.ArmCrash(f.Target, f.Hold)
		healed = began
	}
	if err != nil && ctx.Err() == nil {
		c.logger.Error("fault", "fault", f.String(), "err", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	res := &c.results[i]
	res.StartedSeconds = round3(began.Sub(start).Seconds())
	res.HealedSeconds = round3(healed.Sub(start).Seconds())
	if err != nil {
		res.Error = err.Error()
	}
}

// outage opens a fault window over relays (nil: every relay, as a store or
// Redis fault reaches them all), runs fault, and closes the window
// faultGrace after it returns.
func (c *Campaign) outage(ctx context.Context, relays []int, fault func() error) (time.Time, error) {
	if relays == nil {
		for i := range c.relays.Replicas() {
			relays = append(relays, i)
		}
	}
	w := c.tally.OpenWindow(time.Now(), relays, false)
	err := fault()
	healed := time.Now()
	c.tally.CloseWindow(w, healed.Add(faultGrace), true)
	return healed, err
}

// restart kills a service and starts it again after down.
func restart(ctx context.Context, s Service, down time.Duration) error {
	if err := s.Kill(); err != nil {
		return err
	}
	wait.For(ctx, down)
	// Started even when the run is ending: the teardown stops it cleanly.
	return s.Start(context.WithoutCancel(ctx))
}

// freeze pauses a service for hold. It is resumed whatever happens.
func freeze(ctx context.Context, s Service, hold time.Duration) error {
	if err := s.Pause(); err != nil {
		return err
	}
	wait.For(ctx, hold)
	return s.Resume()
}

// removeAndReturn removes the pair's recipient with an admin token, checks
// that its old token is refused at other relays and re-creates nothing,
// and after the hold registers it again with a fresh token: its next life.
func (c *Campaign) removeAndReturn(ctx context.Context, load Load, f fault) error {
	household, recipient, pollRelay := load.Pair(f.Target)
	n := c.relays.Replicas()
	admin := load.Mint(household, "admin", token.ScopeAdmin, time.Now())
	old := c.tally.BeginRemoval(f.Target, time.Now())

	status, _, err := c.untilAnswered(ctx, load, func(ctx context.Context) (int, []byte, error) {
		return load.Call(ctx, f.Via, http.MethodDelete, "/v1/devices/"+recipient, admin)
	})
	removed := time.Now()
	// 404 only when an earlier attempt committed and its answer was lost.
	refused := err == nil && status != http.StatusNoContent && status != http.StatusNotFound
	// Refused: the life goes on, and the failed fault fails the run.
	c.tally.RemovalAnswered(f.Target, old, removed, refused)
	if refused {
		err = fmt.Errorf("answered %d", status)
	}
	if err != nil {
		return fmt.Errorf("remove %s: %w", recipient, err)
	}

	// The old token at once, at every relay, while some may not have heard
	// of the removal yet: refused, and the device not made again (the
	// directory says, below).
	oldToken := load.Token(f.Target, old)
	var probes sync.WaitGroup
	for j := range n {
		probes.Go(func() {
			c.staleCheck(ctx, load, f.Target, old, recipient, oldToken, (f.Stale+j)%n, staleProbes[j%len(staleProbes)])
		})
	}
	probes.Wait()
	if !wait.Until(ctx, removed.Add(f.Hold)) {
		return ctx.Err()
	}
	c.directoryCheck(ctx, load, recipient, f.Register, admin)

	// iat after the removal, which the relay keeps to the microsecond and
	// the token to the second.
	tok := load.Mint(household, recipient, token.ScopeDevice, removed.Truncate(time.Second).Add(time.Second))
	pollClient, err := load.Client(pollRelay, tok)
	if err != nil {
		return err
	}
	regClient, err := load.Client(f.Register, tok)
	if err != nil {
		return err
	}
	l := &check.Life{Registering: time.Now()}
	var reg client.Registration
	for attempt := 0; ; attempt++ {
		reg, err = regClient.Register(ctx)
		if err == nil || !answer.Retryable(err) || ctx.Err() != nil {
			break
		}
		wait.For(ctx, answer.RetryWait(attempt, err))
	}
	l.Registered = time.Now()
	if err != nil {
		// Installed all the same, so that what follows is judged: a device
		// that did not come back owes nothing but must not receive.
		err = fmt.Errorf("register %s again: %w", recipient, err)
	}
	if err == nil && reg.Cursor != 0 {
		c.mu.Lock()
		c.violateLocked("a registration after a removal did not start over", fmt.Sprintf("%s registered again at relay %d, %.3f s into the sends, with cursor %d, want 0",
			recipient, f.Register, l.Registering.Sub(c.start).Seconds(), reg.Cursor))
		c.mu.Unlock()
	}
	load.Begin(f.Target, l, tok, pollClient, reg.Cursor, reg.Epoch)
	return err
}

// staleProbes are the requests a removed life's token makes right after
// the removal, one per relay: a poll and an ack of cursor 0, and a poll
// whose cursor is far above any head, which a relay that has not heard of
// the removal takes to the store (where the device is gone).
var staleProbes = []string{"poll", "ack", "poll ahead"}

// farAhead is the cursor of a "poll ahead" probe.
const farAhead = 1 << 40

// staleCheck makes one stale probe with tok, the token of life li of pair
// (whose recipient is the device named), removed, at relay i and wants
// 401. A relay that has not heard of the removal yet may accept the token
// (a 2xx, or 409 cursor_ahead for the poll ahead), as [Campaign.Accepted]
// judges.
func (c *Campaign) staleCheck(ctx context.Context, load Load, pair, li int, recipient, tok string, i int, op string) {
	cl, err := load.Client(i, tok)
	if err != nil {
		return
	}
	asked := time.Now()
	err = c.untilDefinitive(ctx, load, func(ctx context.Context) error {
		asked = time.Now()
		switch op {
		case "ack":
			return cl.Ack(ctx, client.Position{})
		case "poll ahead":
			_, err := cl.Poll(ctx, client.PollQuery{Cursor: farAhead})
			return err
		default:
			_, err := cl.Poll(ctx, client.PollQuery{Cursor: 0})
			return err
		}
	})
	var se *client.Error
	switch {
	case err == nil || op == "poll ahead" && errors.As(err, &se) && se.CursorAhead():
		c.countStale(op + " accepted")
		c.Accepted(pair, li, recipient, op, i, asked)
	case errors.As(err, &se) && se.Status == http.StatusUnauthorized:
		c.countStale(op + " 401")
	case errors.As(err, &se):
		c.mu.Lock()
		c.stale[op+" "+answer.Kind(se)]++
		c.violateLocked("old token not refused with 401 after its removal", fmt.Sprintf("%s's %s at relay %d, %.3f s into the sends: %v", recipient, op, i, asked.Sub(c.start).Seconds(), err))
		c.mu.Unlock()
	default:
		// No answer before the run ended: nothing learnt.
		c.countStale(op + " unanswered")
	}
}

// countStale counts an answer of a removal's checks, by kind.
func (c *Campaign) countStale(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stale[kind]++
}

// directoryCheck reads the household's directory at relay i, before the
// recipient registers again: a removed device listed there was made again
// by something, most likely its old token.
func (c *Campaign) directoryCheck(ctx context.Context, load Load, recipient string, i int, admin string) {
	status, body, err := c.untilAnswered(ctx, load, func(ctx context.Context) (int, []byte, error) {
		return load.Call(ctx, i, http.MethodGet, "/v1/devices?limit=1000", admin)
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
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.stale["directory unread"]++
		if ctx.Err() == nil {
			c.violateLocked("directory not readable", fmt.Sprintf("at relay %d: %v", i, err))
		}
		return
	}
	c.stale["directory read"]++
	for _, d := range dir.Devices {
		if d.Device == recipient {
			c.violateLocked("a removed device was listed again before it registered again",
				fmt.Sprintf("%s listed by relay %d, %.3f s into the sends, registered_at %s, after its removal and before its new token registered",
					recipient, i, time.Since(c.start).Seconds(), d.RegisteredAt))
		}
	}
}

// untilDefinitive repeats call while it gets no definitive answer (none,
// or 503), as a careful client would, until the drain ends.
func (c *Campaign) untilDefinitive(ctx context.Context, load Load, call func(context.Context) error) error {
	for attempt := 0; ; attempt++ {
		err := call(ctx)
		if err == nil || !answer.Retryable(err) || ctx.Err() != nil || time.Now().After(load.GiveUp()) {
			return err
		}
		wait.For(ctx, answer.RetryWait(attempt, err))
	}
}

// untilAnswered is untilDefinitive for a plain request.
func (c *Campaign) untilAnswered(ctx context.Context, load Load, call func(context.Context) (int, []byte, error)) (status int, body []byte, err error) {
	err = c.untilDefinitive(ctx, load, func(ctx context.Context) error {
		status, body, err = call(ctx)
		if err == nil && status == http.StatusServiceUnavailable {
			return &client.Error{Status: status}
		}
		return err
	})
	return status, body, err
}

// Summary returns the campaign's part of the report; clientCrashes is
// how many times recipients' clients crashed.
func (c *Campaign) Summary(clientCrashes int) *report.Campaign {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := &report.Campaign{
		Seed:          strconv.FormatUint(c.seed, 10),
		Replay:        c.replay,
		Faults:        c.results,
		ClientCrashes: clientCrashes,
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
