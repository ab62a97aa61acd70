// Package push sends content-free wake-ups ("you have envelopes") to devices
// through UnifiedPush, APNs and FCM.
//
// One Queue per relay process bounds how many pushes wait and how many run,
// and how many of each one household may have, so that one household whose
// endpoints hang or flood cannot hold up everyone else's pushes. A push that
// does not fit is dropped and counted, and the envelope simply waits for the
// device's next poll: a push is a hint, never the delivery.
//
// A Job names a device and where to reach it, and nothing else. It has no
// payload field, so no envelope content can reach a push provider; every
// push carries the same fixed body (see docs/PUSH.md).
package push

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/webpush"
)

// Defaults for the zero values of Config.
const (
	DefaultWorkers     = 8
	DefaultQueueSize   = 1024
	DefaultTimeout     = 30 * time.Second
	DefaultMaxAttempts = 4
	DefaultRetryBase   = 500 * time.Millisecond
	// DefaultHouseholdInFlight: with the default 8 workers, a household
	// whose endpoints all hang holds at most 2 of them (for at most an
	// attempt's bound each) and leaves 6 to everyone else; it takes four
	// such households at once to stall the rest. A household has a few
	// devices, and pushes to healthy endpoints take tens of milliseconds,
	// so 2 at a time delays a household's own wake-ups very little.
	DefaultHouseholdInFlight = 2
	// DefaultHouseholdQueueShare: by default one household may have
	// QueueSize/8 pushes waiting (128 of the default 1024: twice a send to
	// the most recipients the relay allows), so it takes eight households
	// flooding at once to fill the queue for everyone.
	DefaultHouseholdQueueShare = 8
	// DefaultResponseHeaderTimeout: providers answer in well under a
	// second; an endpoint silent for 5 s after the request is written is
	// one that holds connections open, not a slow one.
	DefaultResponseHeaderTimeout = 5 * time.Second
	// DefaultAttemptTimeout bounds one whole exchange: a cold connection
	// (DNS, TCP, TLS) to a distant endpoint, the 5 s for the headers, and
	// the (small, bounded) body.
	DefaultAttemptTimeout = 10 * time.Second
)

var (
	// ErrGone: the provider says the target no longer exists. The queue
	// calls onGone and does not retry.
	ErrGone = errors.New("push: target gone")
	// ErrInvalidEndpoint: a UnifiedPush endpoint that is not an http(s)
	// URL without userinfo, or whose host does not resolve.
	ErrInvalidEndpoint = errors.New("push: invalid endpoint")
	// ErrForbiddenAddress: the endpoint resolves to a loopback, private,
	// link-local or otherwise internal address.
	ErrForbiddenAddress = errors.New("push: endpoint address not allowed")
	// ErrInvalidTarget: an unknown kind or a malformed token.
	ErrInvalidTarget = errors.New("push: invalid target")
)

// RetryableError is a provider's answer that may succeed later (429, 5xx).
// After is the provider's Retry-After, zero when it gave none.
type RetryableError struct {
	Err   error
	After time.Duration
}

func (e *RetryableError) Error() string { return e.Err.Error() }
func (e *RetryableError) Unwrap() error { return e.Err }

// statusError is a complete answer other than a success. It names who
// answered and what, never the target.
type statusError struct {
	from   string // the provider kind, or "fcm token endpoint"
	status int
	reason string // the provider's error code, if it gave one
}

func (e *statusError) Error() string {
	if e.reason == "" {
		return fmt.Sprintf("%s: status %d", e.from, e.status)
	}
	return fmt.Sprintf("%s: status %d %s", e.from, e.status, e.reason)
}

// Provider sends one content-free wake to an address of its kind.
type Provider interface {
	// Push returns nil when the provider accepted the push, an error
	// wrapping ErrGone when the target no longer exists, a
	// *RetryableError when it may succeed later, and any other error
	// when it never will. No error names the address.
	Push(ctx context.Context, address string) error
	// Close releases idle connections.
	Close()
}

// Job is one push for one device. It deliberately has no payload.
type Job struct {
	Household string
	Device    string
	Target    device.PushTarget
}

// Config configures a Queue. Zero values take the defaults above.
type Config struct {
	Workers     int           // pushes sent at a time (FN_PUSH_WORKERS)
	QueueSize   int           // pushes waiting (FN_PUSH_QUEUE)
	Timeout     time.Duration // deadline of one push, retries included
	MaxAttempts int           // tries per push, the first included
	RetryBase   time.Duration // first retry's backoff, doubled per retry
	// HouseholdInFlight caps one household's pushes being sent at once.
	// A worker skips a household at its cap and takes the next
	// household's push, so endpoints that hang cost their own household
	// its pushes, not everyone. Default DefaultHouseholdInFlight.
	HouseholdInFlight int
	// HouseholdQueue caps one household's pushes waiting; past it its
	// pushes are dropped with reason household_full while other
	// households' still queue. Default QueueSize/DefaultHouseholdQueueShare,
	// at least 1.
	HouseholdQueue int
	// ResponseHeaderTimeout bounds the wait for a provider's status line
	// and headers once the request is written.
	ResponseHeaderTimeout time.Duration
	// AttemptTimeout bounds one exchange with a provider, from connecting
	// to the last byte of its answer, so that an endpoint that trickles
	// its answer costs a worker this long at most. Timeout still bounds
	// the whole push, retries included.
	AttemptTimeout time.Duration
	// AllowPrivate lets UnifiedPush endpoints reach loopback, private and
	// link-local addresses (FN_PUSH_ALLOW_PRIVATE). Tests and LANs only.
	AllowPrivate bool

	UnifiedPush UnifiedPushConfig
	WebPush     WebPushConfig // enabled when VAPID is set
	APNs        APNsConfig    // enabled when KeyFile is set
	FCM         FCMConfig     // enabled when CredentialsFile is set

	Registerer prometheus.Registerer // nil: no metrics
	Logger     *slog.Logger          // nil: discard
}

// WebPushConfig configures Web Push, for the webpush kind and for
// UnifiedPush registrations that carry keys (on UnifiedPush's resolver and
// roots).
type WebPushConfig struct {
	VAPID *webpush.VAPID   // nil: no webpush kind, and UnifiedPush's Web Push unsigned
	Now   func() time.Time // the VAPID tokens' clock; nil: time.Now
}

// UnifiedPushConfig configures the UnifiedPush provider, which is always on.
type UnifiedPushConfig struct {
	Resolver Resolver       // nil: net.DefaultResolver
	RootCAs  *x509.CertPool // nil: the system's roots
}

// APNsConfig configures token-based APNs.
type APNsConfig struct {
	KeyFile string // .p8 file: PKCS#8 EC P-256 private key (FN_APNS_KEY_FILE)
	KeyID   string // FN_APNS_KEY_ID
	TeamID  string // FN_APNS_TEAM_ID
	Topic   string // the app's bundle id (FN_APNS_TOPIC)
	URL     string // default https://api.push.apple.com (FN_APNS_URL)
	RootCAs *x509.CertPool
	// AlertText is the text of alert pushes (FN_APNS_ALERT_TEXT), shown
	// only when the app's extension cannot replace it; default
	// DefaultAPNsAlertText.
	AlertText string
}

// FCMConfig configures FCM HTTP v1.
type FCMConfig struct {
	CredentialsFile string // service-account JSON (FN_FCM_CREDENTIALS_FILE)
	URL             string // default https://fcm.googleapis.com (FN_FCM_URL)
	TokenURL        string // default: the file's token_uri (FN_FCM_TOKEN_URL)
	RootCAs         *x509.CertPool
}

// Stats are the queue's counters. Once Close has returned,
// Attempted == Sent + Dropped + Failed; before, Queued and InFlight make up
// the difference.
type Stats struct {
	Attempted uint64 // Enqueue calls other than coalesced ones
	Coalesced uint64 // Enqueue calls for a device whose push was already queued
	Sent      uint64 // accepted by the provider
	Failed    uint64 // given up, Gone included
	Gone      uint64 // the provider said the target is gone
	Retried   uint64 // retries (not pushes)
	Dropped   uint64 // all reasons below

	DroppedQueueFull     uint64 // the queue was full
	DroppedHouseholdFull uint64 // the household had HouseholdQueue pushes waiting
	DroppedShutdown      uint64 // queued or in flight when the queue closed
	DroppedUnconfigured  uint64 // no provider for the target's kind

	// Deferred counts pushes held back, for a while, because their
	// household had HouseholdInFlight pushes in flight; other households'
	// pushes went first meanwhile. Each push counts at most once.
	Deferred uint64

	Queued          int // waiting now
	InFlight        int // being sent now
	QueueHighWater  int // most ever waiting at once
	HouseholdsAtCap int // households at their in-flight cap with pushes waiting, now
}

type dropReason int

const (
	dropQueueFull dropReason = iota
	dropHouseholdFull
	dropShutdown
	dropUnconfigured
	numDropReasons
)

var dropReasonNames = [numDropReasons]string{"queue_full", "household_full", "shutdown", "unconfigured"}

type entry struct {
	key      string
	job      Job
	h        *household
	deferred bool // counted once as deferred
}

// household holds one household's waiting pushes. It is in the queue's
// households map while it has pushes waiting or in flight, and then in
// exactly one of two states: ready (in the ready list, under its in-flight
// cap) or capped (at its cap, waiting for one of its pushes to end).
type household struct {
	name     string
	queue    fifo[*entry]
	inFlight int
	ready    bool
	capped   bool
}

// Queue is the process's bounded push queue. Workers serve the households
// with pushes waiting round-robin, one push per turn, and skip those at
// their in-flight cap.
type Queue struct {
	cfg       Config
	log       *slog.Logger
	providers map[string]Provider
	resolver  Resolver
	onGone    func(context.Context, Job)
	metrics   *metrics
	dropLog   rate.Sometimes
	failLog   rate.Sometimes

	base   context.Context // cancelled when Close gives up waiting
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{} // closed when every worker has returned

	mu         sync.Mutex
	cond       *sync.Cond // signalled when a household becomes ready or the queue closes
	closed     bool
	households map[string]*household
	ready      fifo[*household] // households under their cap with pushes waiting, next first
	n          int              // pushes waiting, all households
	pending    map[string]*entry
	inFlight   int
	highWater  int
	atCap      int // households capped

	attempted, coalesced, sent, failed, gone, retried, deferred atomic.Uint64
	dropped                                                     [numDropReasons]atomic.Uint64
}

// New builds the providers and starts the workers. onGone is called (from a
// worker) when a provider says a job's target is gone; the relay clears the
// device's push target there. It may be nil.
func New(cfg Config, onGone func(ctx context.Context, j Job)) (*Queue, error) {
	cfg = withDefaults(cfg)
	if cfg.Workers < 1 || cfg.QueueSize < 1 || cfg.MaxAttempts < 1 || cfg.Timeout <= 0 || cfg.RetryBase <= 0 ||
		cfg.HouseholdInFlight < 1 || cfg.HouseholdQueue < 1 || cfg.ResponseHeaderTimeout <= 0 || cfg.AttemptTimeout <= 0 {
		return nil, fmt.Errorf("push: workers, queue sizes, attempts, timeouts and retry base must be positive")
	}
	log := cfg.Logger.With("component", "push")
	providers, err := newProviders(cfg)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer, providers, cfg.QueueSize)
	if err != nil {
		closeProviders(providers)
		return nil, err
	}
	if onGone == nil {
		onGone = func(context.Context, Job) {}
	}
	resolver := cfg.UnifiedPush.Resolver
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	base, cancel := context.WithCancel(context.Background())
	q := &Queue{
		cfg:       cfg,
		log:       log,
		providers: providers,
		resolver:  resolver,
		onGone:    onGone,
		metrics:   m,
		// The first drop is logged at once, then at most one line per
		// interval with the running total, however many drops.
		dropLog:    rate.Sometimes{First: 1, Interval: 10 * time.Second},
		failLog:    rate.Sometimes{First: 1, Interval: 10 * time.Second},
		base:       base,
		cancel:     cancel,
		done:       make(chan struct{}),
		households: make(map[string]*household),
		pending:    make(map[string]*entry, cfg.QueueSize),
	}
	q.cond = sync.NewCond(&q.mu)
	q.wg.Add(cfg.Workers)
	for range cfg.Workers {
		go q.work()
	}
	go func() {
		q.wg.Wait()
		close(q.done)
	}()
	return q, nil
}

func withDefaults(cfg Config) Config {
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.RetryBase == 0 {
		cfg.RetryBase = DefaultRetryBase
	}
	if cfg.HouseholdInFlight == 0 {
		cfg.HouseholdInFlight = DefaultHouseholdInFlight
	}
	if cfg.HouseholdQueue == 0 {
		cfg.HouseholdQueue = max(1, cfg.QueueSize/DefaultHouseholdQueueShare)
	}
	if cfg.ResponseHeaderTimeout == 0 {
		cfg.ResponseHeaderTimeout = DefaultResponseHeaderTimeout
	}
	if cfg.AttemptTimeout == 0 {
		cfg.AttemptTimeout = DefaultAttemptTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg
}

// Enabled reports whether pushes of this kind can be sent, so the relay can
// refuse to register a target that would never get one.
func (q *Queue) Enabled(kind string) bool { return q.providers[kind] != nil }

// CheckTarget is CheckTarget with this queue's AllowPrivate and resolver:
// it refuses exactly the targets this queue's providers would refuse before
// sending. It does not ask whether the kind is Enabled.
func (q *Queue) CheckTarget(ctx context.Context, t device.PushTarget) error {
	return checkTarget(ctx, t, q.cfg.AllowPrivate, q.resolver)
}

// Enqueue queues a push for j's device and never blocks. It returns false
// when the push was dropped (queue or household share full, queue closed,
// no provider for the kind) or when a push for the device is already
// queued; in that case the queued push takes j's target and wakes the
// device for both sends.
func (q *Queue) Enqueue(j Job) bool {
	if q.providers[j.Target.Kind] == nil || j.Target.Address == "" {
		q.attempted.Add(1)
		q.metrics.attempt()
		q.drop(dropUnconfigured, 1, "")
		return false
	}
	key := j.Household + "\x00" + j.Device // names never contain NUL

	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		q.attempted.Add(1)
		q.metrics.attempt()
		q.drop(dropShutdown, 1, "")
		return false
	}
	if e, ok := q.pending[key]; ok {
		e.job.Target = j.Target // the newest registration wins
		q.mu.Unlock()
		q.coalesced.Add(1)
		q.metrics.coalesce()
		return false
	}
	h := q.households[j.Household]
	// The household's own bound first: when both are reached, the
	// household is the one filling the queue.
	if h != nil && h.queue.len() >= q.cfg.HouseholdQueue {
		q.mu.Unlock()
		q.attempted.Add(1)
		q.metrics.attempt()
		q.drop(dropHouseholdFull, 1, j.Household)
		return false
	}
	if q.n == q.cfg.QueueSize {
		q.mu.Unlock()
		q.attempted.Add(1)
		q.metrics.attempt()
		q.drop(dropQueueFull, 1, "")
		return false
	}
	if h == nil {
		h = &household{name: j.Household}
		q.households[j.Household] = h
	}
	e := &entry{key: key, job: j, h: h}
	h.queue.push(e)
	q.n++
	q.pending[key] = e
	q.highWater = max(q.highWater, q.n)
	switch {
	case h.capped:
		q.deferLocked(e)
	case h.ready:
	case h.inFlight < q.cfg.HouseholdInFlight:
		h.ready = true
		q.ready.push(h)
	default: // its cap is taken by pushes that left the queue already
		q.capLocked(h)
	}
	// Counted under the lock so that a worker cannot finish the push
	// before it is attempted.
	q.attempted.Add(1)
	q.metrics.attempt()
	q.metrics.setQueued(q.n)
	q.cond.Signal()
	q.mu.Unlock()
	return true
}

// capLocked marks h as at its in-flight cap with pushes waiting: it leaves
// the ready list until one of its pushes ends. The caller holds mu.
func (q *Queue) capLocked(h *household) {
	h.ready, h.capped = false, true
	q.atCap++
	q.metrics.setAtCap(q.atCap)
	h.queue.each(q.deferLocked)
}

// deferLocked counts e, once, as a push its household's cap holds back.
func (q *Queue) deferLocked(e *entry) {
	if !e.deferred {
		e.deferred = true
		q.deferred.Add(1)
		q.metrics.deferral()
	}
}

// take waits for a household under its cap with a push waiting and takes
// that push, or returns nil once the queue is closed.
func (q *Queue) take() *entry {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.ready.len() == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return nil
	}
	h := q.ready.pop()
	e := h.queue.pop()
	q.n--
	// Leaving pending before the push starts: a send that commits from
	// here on queues a new push, so it cannot be folded into one that has
	// already gone out.
	delete(q.pending, e.key)
	h.inFlight++
	q.inFlight++
	switch {
	case h.queue.len() == 0:
		h.ready = false
	case h.inFlight < q.cfg.HouseholdInFlight:
		// To the back of the line: one push per household per turn.
		q.ready.push(h)
		q.cond.Signal()
	default:
		q.capLocked(h)
	}
	q.metrics.setQueued(q.n)
	return e
}

// finish ends a push of h's that take handed out.
func (q *Queue) finish(h *household) {
	q.mu.Lock()
	defer q.mu.Unlock()
	h.inFlight--
	q.inFlight--
	if h.capped {
		h.capped = false
		q.atCap--
		q.metrics.setAtCap(q.atCap)
		if h.queue.len() > 0 {
			h.ready = true
			q.ready.push(h)
			q.cond.Signal()
		}
	}
	if !h.ready && h.inFlight == 0 && h.queue.len() == 0 {
		delete(q.households, h.name)
	}
}

// Close stops taking pushes, drops (and counts) the queued ones, gives the
// ones in flight until ctx ends, then cancels and counts them as dropped.
// It returns when every worker has returned. Safe to call more than once.
func (q *Queue) Close(ctx context.Context) {
	q.mu.Lock()
	first := !q.closed
	if first {
		q.closed = true
		dropped := q.n
		for name, h := range q.households {
			h.queue.reset()
			if h.capped {
				h.capped = false
				q.atCap--
			}
			h.ready = false
			if h.inFlight == 0 {
				delete(q.households, name)
			}
		}
		q.ready.reset()
		clear(q.pending)
		q.n = 0
		q.metrics.setQueued(0)
		q.metrics.setAtCap(q.atCap)
		q.cond.Broadcast()
		q.mu.Unlock()
		if dropped > 0 {
			q.drop(dropShutdown, dropped, "")
		}
	} else {
		q.mu.Unlock()
	}

	select {
	case <-q.done:
	case <-ctx.Done():
		q.cancel() // in-flight pushes see their context end at once
		<-q.done
	}
	q.cancel()
	closeProviders(q.providers)

	s := q.Stats()
	if first && (s.Dropped > 0 || s.Failed > 0) {
		q.log.Info("push queue closed",
			"sent_total", s.Sent, "dropped_total", s.Dropped,
			"dropped_shutdown_total", s.DroppedShutdown, "failed_total", s.Failed)
	}
}

// Stats reports the counters.
func (q *Queue) Stats() Stats {
	q.mu.Lock()
	queued, inFlight, high, atCap := q.n, q.inFlight, q.highWater, q.atCap
	q.mu.Unlock()
	s := Stats{
		Attempted:            q.attempted.Load(),
		Coalesced:            q.coalesced.Load(),
		Sent:                 q.sent.Load(),
		Failed:               q.failed.Load(),
		Gone:                 q.gone.Load(),
		Retried:              q.retried.Load(),
		DroppedQueueFull:     q.dropped[dropQueueFull].Load(),
		DroppedHouseholdFull: q.dropped[dropHouseholdFull].Load(),
		DroppedShutdown:      q.dropped[dropShutdown].Load(),
		DroppedUnconfigured:  q.dropped[dropUnconfigured].Load(),
		Deferred:             q.deferred.Load(),
		Queued:               queued,
		InFlight:             inFlight,
		QueueHighWater:       high,
		HouseholdsAtCap:      atCap,
	}
	s.Dropped = s.DroppedQueueFull + s.DroppedHouseholdFull + s.DroppedShutdown + s.DroppedUnconfigured
	return s
}

// drop counts n dropped pushes. household, when not empty, is the one
// whose share was full; the (rate-limited) log line names it, since the
// metrics do not.
func (q *Queue) drop(r dropReason, n int, household string) {
	total := q.dropped[r].Add(uint64(n))
	q.metrics.drop(r, n)
	q.dropLog.Do(func() {
		var all uint64
		for i := range q.dropped {
			all += q.dropped[i].Load()
		}
		attrs := []any{"reason", dropReasonNames[r], "reason_total", total, "dropped_total", all}
		if household != "" {
			attrs = append(attrs, "household", household)
		}
		q.log.Warn("push dropped", attrs...)
	})
}

func (q *Queue) work() {
	defer q.wg.Done()
	for {
		e := q.take()
		if e == nil {
			return
		}
		q.run(e.job)
		q.finish(e.h)
	}
}

// run sends one job and counts how it ended. What it logs names the
// provider, household, device and HTTP status, never the target's address.
func (q *Queue) run(j Job) {
	kind := j.Target.Kind
	ctx, cancel := context.WithTimeout(q.base, q.cfg.Timeout)
	defer cancel()
	start := time.Now()
	err := q.deliver(ctx, q.providers[kind], j.Target.Address, kind)
	q.metrics.observe(kind, time.Since(start))

	switch {
	case err == nil:
		q.sent.Add(1)
		q.metrics.send()
	case errors.Is(err, ErrGone):
		q.gone.Add(1)
		q.failed.Add(1)
		q.metrics.fail(kind, true)
		q.log.Debug("push target gone", "provider", kind, "household", j.Household, "device", j.Device,
			"status", answerStatus(err), "err", logErr(err, j.Target.Address))
		// A fresh deadline: a gone answer near the push's deadline must
		// still clear the target. Shutdown still cancels it.
		gctx, gcancel := context.WithTimeout(q.base, 10*time.Second)
		q.onGone(gctx, j)
		gcancel()
	case q.base.Err() != nil:
		q.drop(dropShutdown, 1, "")
	default:
		total := q.failed.Add(1)
		q.metrics.fail(kind, false)
		q.failLog.Do(func() {
			q.log.Warn("push failed", "provider", kind, "household", j.Household, "device", j.Device,
				"status", answerStatus(err), "err", logErr(err, j.Target.Address), "failed_total", total)
		})
	}
}

// answerStatus is the HTTP status of the provider's last answer, 0 when
// there was none (no connection, a timeout, a refused target).
func answerStatus(err error) int {
	var se *statusError
	if errors.As(err, &se) {
		return se.status
	}
	return 0
}

// logErr is err's message for a log line. The providers' errors never name
// the address; replacing it here too keeps any that a library might embed
// in the future out of the log.
func logErr(err error, address string) string {
	msg := err.Error()
	if address != "" {
		msg = strings.ReplaceAll(msg, address, "[target]")
	}
	return msg
}
