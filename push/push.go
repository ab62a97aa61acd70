// Package push sends content-free wake-ups ("you have envelopes") to devices
// through UnifiedPush, APNs and FCM.
//
// One Queue per relay process bounds how many pushes wait and how many run.
// A push that does not fit is dropped and counted, and the envelope simply
// waits for the device's next poll: a push is a hint, never the delivery.
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
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// Target kinds, as in SPEC.md.
const (
	KindNone        = "none"
	KindUnifiedPush = "unifiedpush"
	KindAPNs        = "apns"
	KindFCM         = "fcm"
)

// Defaults for the zero values of Config.
const (
	DefaultWorkers     = 8
	DefaultQueueSize   = 1024
	DefaultTimeout     = 30 * time.Second
	DefaultMaxAttempts = 4
	DefaultRetryBase   = 500 * time.Millisecond
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

// Provider sends one content-free wake to an address of its kind.
type Provider interface {
	// Push returns nil when the provider accepted the push, an error
	// wrapping ErrGone when the target no longer exists, a
	// *RetryableError when it may succeed later, and any other error
	// when it never will.
	Push(ctx context.Context, address string) error
	// Close releases idle connections.
	Close()
}

// Target is where a device's pushes go.
type Target struct {
	Kind    string // KindUnifiedPush, KindAPNs or KindFCM
	Address string // endpoint URL, APNs hex device token or FCM registration token
}

// Job is one push for one device. It deliberately has no payload.
type Job struct {
	Household string
	Device    string
	Target    Target
}

// Config configures a Queue. Zero values take the defaults above.
type Config struct {
	Workers     int           // pushes sent at a time (FN_PUSH_WORKERS)
	QueueSize   int           // pushes waiting (FN_PUSH_QUEUE)
	Timeout     time.Duration // deadline of one push, retries included
	MaxAttempts int           // tries per push, the first included
	RetryBase   time.Duration // first retry's backoff, doubled per retry
	// AllowPrivate lets UnifiedPush endpoints reach loopback, private and
	// link-local addresses (FN_PUSH_ALLOW_PRIVATE). Tests and LANs only.
	AllowPrivate bool

	UnifiedPush UnifiedPushConfig
	APNs        APNsConfig // enabled when KeyFile is set
	FCM         FCMConfig  // enabled when CredentialsFile is set

	Registerer prometheus.Registerer // nil: no metrics
	Logger     *slog.Logger          // nil: discard
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

	DroppedQueueFull    uint64 // the queue was full
	DroppedShutdown     uint64 // queued or in flight when the queue closed
	DroppedUnconfigured uint64 // no provider for the target's kind

	Queued         int // waiting now
	InFlight       int // being sent now
	QueueHighWater int // most ever waiting at once
}

type dropReason int

const (
	dropQueueFull dropReason = iota
	dropShutdown
	dropUnconfigured
	numDropReasons
)

var dropReasonNames = [numDropReasons]string{"queue_full", "shutdown", "unconfigured"}

type entry struct {
	key string
	job Job
}

// Queue is the process's bounded push queue.
type Queue struct {
	cfg       Config
	log       *slog.Logger
	providers map[string]Provider
	onGone    func(context.Context, Job)
	metrics   *metrics
	dropLog   rate.Sometimes
	failLog   rate.Sometimes

	base   context.Context // cancelled when Close gives up waiting
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{} // closed when every worker has returned

	mu        sync.Mutex
	cond      *sync.Cond // signalled when an entry is queued or the queue closes
	closed    bool
	ring      []*entry // FIFO of capacity QueueSize
	head, n   int
	pending   map[string]*entry // the queued entry of each device
	inFlight  int
	highWater int

	attempted, coalesced, sent, failed, gone, retried atomic.Uint64
	dropped                                           [numDropReasons]atomic.Uint64
}

// New builds the providers and starts the workers. onGone is called (from a
// worker) when a provider says a job's target is gone; the relay clears the
// device's push target there. It may be nil.
func New(cfg Config, onGone func(ctx context.Context, j Job)) (*Queue, error) {
	cfg = withDefaults(cfg)
	if cfg.Workers < 1 || cfg.QueueSize < 1 || cfg.MaxAttempts < 1 || cfg.Timeout <= 0 || cfg.RetryBase <= 0 {
		return nil, fmt.Errorf("push: workers, queue size, attempts, timeout and retry base must be positive")
	}
	log := cfg.Logger.With("component", "push")
	providers, err := newProviders(cfg)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer, providers)
	if err != nil {
		closeProviders(providers)
		return nil, err
	}
	if onGone == nil {
		onGone = func(context.Context, Job) {}
	}
	base, cancel := context.WithCancel(context.Background())
	q := &Queue{
		cfg:       cfg,
		log:       log,
		providers: providers,
		onGone:    onGone,
		metrics:   m,
		// The first drop is logged at once, then at most one line per
		// interval with the running total, however many drops.
		dropLog: rate.Sometimes{First: 1, Interval: 10 * time.Second},
		failLog: rate.Sometimes{First: 1, Interval: 10 * time.Second},
		base:    base,
		cancel:  cancel,
		done:    make(chan struct{}),
		ring:    make([]*entry, cfg.QueueSize),
		pending: make(map[string]*entry, cfg.QueueSize),
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
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg
}

// Enabled reports whether pushes of this kind can be sent, so the relay can
// refuse to register a target that would never get one.
func (q *Queue) Enabled(kind string) bool { return q.providers[kind] != nil }

// Enqueue queues a push for j's device and never blocks. It returns false
// when the push was dropped (queue full, queue closed, no provider for the
// kind) or when a push for the device is already queued; in that case the
// queued push takes j's target and wakes the device for both sends.
func (q *Queue) Enqueue(j Job) bool {
	if q.providers[j.Target.Kind] == nil || j.Target.Address == "" {
		q.attempted.Add(1)
		q.metrics.attempt()
		q.drop(dropUnconfigured, 1)
		return false
	}
	key := j.Household + "\x00" + j.Device // names never contain NUL

	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		q.attempted.Add(1)
		q.metrics.attempt()
		q.drop(dropShutdown, 1)
		return false
	}
	if e, ok := q.pending[key]; ok {
		e.job.Target = j.Target // the newest registration wins
		q.mu.Unlock()
		q.coalesced.Add(1)
		q.metrics.coalesce()
		return false
	}
	if q.n == len(q.ring) {
		q.mu.Unlock()
		q.attempted.Add(1)
		q.metrics.attempt()
		q.drop(dropQueueFull, 1)
		return false
	}
	e := &entry{key: key, job: j}
	q.ring[(q.head+q.n)%len(q.ring)] = e
	q.n++
	q.pending[key] = e
	q.highWater = max(q.highWater, q.n)
	// Counted under the lock so that a worker cannot finish the push
	// before it is attempted.
	q.attempted.Add(1)
	q.metrics.attempt()
	q.metrics.setQueued(q.n)
	q.cond.Signal()
	q.mu.Unlock()
	return true
}

// Close stops taking pushes, drops (and counts) the queued ones, gives the
// ones in flight until ctx ends, then cancels and counts them as dropped.
// It returns when every worker has returned. Safe to call more than once.
func (q *Queue) Close(ctx context.Context) {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		dropped := q.n
		for q.n > 0 {
			e := q.pop()
			delete(q.pending, e.key)
		}
		q.metrics.setQueued(0)
		q.cond.Broadcast()
		q.mu.Unlock()
		if dropped > 0 {
			q.drop(dropShutdown, dropped)
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
	if s.Dropped > 0 || s.Failed > 0 {
		q.log.Info("push queue closed",
			"sent_total", s.Sent, "dropped_total", s.Dropped,
			"dropped_shutdown_total", s.DroppedShutdown, "failed_total", s.Failed)
	}
}

// Stats reports the counters.
func (q *Queue) Stats() Stats {
	q.mu.Lock()
	queued, inFlight, high := q.n, q.inFlight, q.highWater
	q.mu.Unlock()
	s := Stats{
		Attempted:           q.attempted.Load(),
		Coalesced:           q.coalesced.Load(),
		Sent:                q.sent.Load(),
		Failed:              q.failed.Load(),
		Gone:                q.gone.Load(),
		Retried:             q.retried.Load(),
		DroppedQueueFull:    q.dropped[dropQueueFull].Load(),
		DroppedShutdown:     q.dropped[dropShutdown].Load(),
		DroppedUnconfigured: q.dropped[dropUnconfigured].Load(),
		Queued:              queued,
		InFlight:            inFlight,
		QueueHighWater:      high,
	}
	s.Dropped = s.DroppedQueueFull + s.DroppedShutdown + s.DroppedUnconfigured
	return s
}

// pop takes the oldest entry; the caller holds mu and knows n > 0.
func (q *Queue) pop() *entry {
	e := q.ring[q.head]
	q.ring[q.head] = nil
	q.head = (q.head + 1) % len(q.ring)
	q.n--
	return e
}

func (q *Queue) drop(r dropReason, n int) {
	total := q.dropped[r].Add(uint64(n))
	q.metrics.drop(r, n)
	q.dropLog.Do(func() {
		q.log.Warn("push dropped", "reason", dropReasonNames[r],
			"reason_total", total,
			"dropped_total", q.dropped[dropQueueFull].Load()+q.dropped[dropShutdown].Load()+q.dropped[dropUnconfigured].Load())
	})
}

func (q *Queue) work() {
	defer q.wg.Done()
	for {
		q.mu.Lock()
		for q.n == 0 && !q.closed {
			q.cond.Wait()
		}
		if q.closed {
			q.mu.Unlock()
			return
		}
		e := q.pop()
		// Leaving pending before the push starts: a send that commits
		// from here on queues a new push, so it cannot be folded into
		// one that has already gone out.
		delete(q.pending, e.key)
		q.inFlight++
		q.metrics.setQueued(q.n)
		q.mu.Unlock()

		q.run(e.job)

		q.mu.Lock()
		q.inFlight--
		q.mu.Unlock()
	}
}

// run sends one job and counts how it ended.
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
		q.log.Debug("push target gone", "provider", kind,
			"household", j.Household, "device", j.Device, "err", err)
		// A fresh deadline: a gone answer near the push's deadline must
		// still clear the target. Shutdown still cancels it.
		gctx, gcancel := context.WithTimeout(q.base, 10*time.Second)
		q.onGone(gctx, j)
		gcancel()
	case q.base.Err() != nil:
		q.drop(dropShutdown, 1)
	default:
		total := q.failed.Add(1)
		q.metrics.fail(kind, false)
		q.failLog.Do(func() {
			q.log.Warn("push failed", "provider", kind, "err", err, "failed_total", total)
		})
	}
}
