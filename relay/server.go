// Package relay is the relay's HTTP API: routes, handlers, token checks,
// admission, the poll loop and the server's lifecycle (the codec is
// internal/wire's, pairing is package pairing's). It is the only package
// that knows the store, the wake hub and the push queue; they know nothing
// of each other.
package relay

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/accesslog"
	"github.com/flamenet/relay/internal/bodyguard"
	"github.com/flamenet/relay/internal/buckets"
	"github.com/flamenet/relay/internal/cors"
	"github.com/flamenet/relay/internal/expire"
	"github.com/flamenet/relay/internal/fleet"
	"github.com/flamenet/relay/internal/memory"
	"github.com/flamenet/relay/internal/pairing"
	"github.com/flamenet/relay/internal/parking"
	"github.com/flamenet/relay/internal/ready"
	"github.com/flamenet/relay/internal/service"
	"github.com/flamenet/relay/internal/storecalls"
	"github.com/flamenet/relay/push"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/wake"
)

// Pusher queues a content-free push for a device that holds no poll here.
// Enqueue must never block; *push.Queue is one.
type Pusher interface {
	Enqueue(j push.Job) bool
	// Enabled reports whether pushes of the kind can be sent at all.
	Enabled(kind string) bool
	// CheckTarget refuses a target the workers would refuse.
	CheckTarget(ctx context.Context, t device.PushTarget) error
}

// Deps are the relay's collaborators, built and owned by the caller.
type Deps struct {
	Store  store.Store
	Hub    wake.Hub
	Push   Pusher // nil: no pushes
	Logger *slog.Logger
	// AccessLogger writes the access log's lines; nil: Logger. The binary
	// gives it a writer that batches lines (internal/linebuf), so that a
	// request's line is not a system call on its path.
	AccessLogger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Metrics is where the API registers its series; nil: not exported.
	Metrics prometheus.Registerer
}

// Server serves the API for one relay process.
type Server struct {
	cfg   Config
	keys  []ed25519.PublicKey
	store store.Store
	hub   wake.Hub
	push  Pusher
	log   *slog.Logger
	now   func() time.Time

	memory *memory.Memory
	// watch checks the store's history and knows its current epoch.
	watch   *memory.HistoryCheck
	parking *parking.Lot  // nil until Serve
	fleet   *fleet.Member // nil with one relay
	// services are the background work, started in New and stopped in
	// Shutdown, in one order.
	services  service.Group
	handler   http.Handler
	metrics   *metrics
	verified  verified
	readiness *ready.State // draining, and the store's probe
	limits    limits
	streams   streamSet // the streams senders deliver to (inline.go)
	logs      logs
	hooks     hooks
	run       run
}

// limits is what admission counts and bounds (admission.go, answers.go).
type limits struct {
	held        atomic.Int64 // polls currently held (waiting)
	answers     *answerBytes // poll answers in flight (answers.go)
	timing      answerTiming // how long answers have to be written
	inflight    chan struct{}
	limiter     *rate.Limiter
	households  *buckets.Buckets[string]
	devicePolls *buckets.Buckets[device.Key]
	gates       *gates // nil: the store queues sends per device itself
}

// logs is what keeps the relay's lines few.
type logs struct {
	// access writes the access log.
	access *accesslog.Log
	// tokensRefused counts 401s for the rate-limited log line.
	tokensRefused atomic.Uint64
	refusedLog    rate.Sometimes
	ackLog        rate.Sometimes
	// staleAcks counts acknowledgements the store skipped for being of
	// an older epoch, for the rate-limited log line.
	staleAcks   atomic.Uint64
	staleAckLog rate.Sometimes
	// corsRefused counts requests from origins FN_CORS_ORIGINS does not
	// allow, for the rate-limited log line (corsRefused).
	corsRefused    atomic.Uint64
	corsRefusedLog rate.Sometimes
}

// hooks are set by tests only.
type hooks struct {
	// afterFirstRead runs right after a poll's first read of the device's
	// position (the ack, which reads the head) and before anything else:
	// a send committed there must still wake it.
	afterFirstRead func(k device.Key)
	// beforeWake runs after a send's commit, right before its wakes are
	// signalled.
	beforeWake func(ws []wake.Wake)
	// streamPing, above zero, is the keep-alive interval of streams.
	streamPing time.Duration
	// streamLook runs in a hijacked stream's wait, between setting the
	// read's deadline and looking for news.
	streamLook func()
	// sendersTook runs after a send took the idle streams it delivers
	// to, before its Signal (inline.go); senderDelivered after a sender
	// delivered to a stream, handing the rest back or not.
	sendersTook     func()
	senderDelivered func(handedBack bool)
}

// run is the server's listening life.
type run struct {
	mu   sync.Mutex
	shut bool // Shutdown has begun; a later Serve serves nothing
	http *http.Server
	done chan struct{}
}

// New builds a server. cfg.IssuerKeys must hold at least one key.
func New(cfg Config, deps Deps) (*Server, error) {
	if len(cfg.IssuerKeys) == 0 {
		return nil, errors.New("relay: no issuer key to trust")
	}
	if deps.Store == nil || deps.Hub == nil {
		return nil, errors.New("relay: a store and a wake hub are required")
	}
	if cfg.Console && cfg.IssuerKey == nil {
		return nil, errors.New("relay: the console pairs devices, which needs the relay's own issuer key")
	}
	if cfg.AnswerTimeout <= 0 || cfg.AnswerMinRate <= 0 {
		return nil, errors.New("relay: answers need a timeout and a minimum rate above zero")
	}
	s := &Server{
		cfg:  cfg,
		keys: cfg.IssuerKeys,
		hub:  deps.Hub,
		push: deps.Push,
		log:  deps.Logger,
		now:  deps.Now,
		limits: limits{
			inflight:    make(chan struct{}, cfg.SendInflight),
			limiter:     rate.NewLimiter(rate.Limit(cfg.SendRate), cfg.SendBurst),
			households:  buckets.New[string](cfg.HouseholdSendRate, cfg.HouseholdSendBurst),
			devicePolls: buckets.New[device.Key](cfg.DevicePollRate, cfg.DevicePollBurst),
		},
		logs: logs{
			refusedLog:  rate.Sometimes{First: 1, Interval: 10 * time.Second},
			ackLog:      rate.Sometimes{First: 1, Interval: 10 * time.Second},
			staleAckLog: rate.Sometimes{First: 1, Interval: time.Minute},
			// Any page can send an Origin: a line a minute at most.
			corsRefusedLog: rate.Sometimes{First: 1, Interval: time.Minute},
		},
		run: run{done: make(chan struct{})},
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	access := deps.AccessLogger
	if access == nil {
		access = s.log
	}
	s.logs.access = accesslog.New(access, s.log)
	if s.now == nil {
		s.now = time.Now
	}
	s.limits.timing = answerTiming{base: cfg.AnswerTimeout, rate: cfg.AnswerMinRate}
	if s.cfg.DeviceAnswerBytesInFlight == 0 {
		s.cfg.DeviceAnswerBytesInFlight = 2 * s.cfg.pendingAnswerSize(math.MaxInt64, maxPollLimit)
	}
	if s.cfg.AnswerBytesInFlight == 0 {
		s.cfg.AnswerBytesInFlight = defaultAnswerBytes()
	}
	s.limits.answers = newAnswerBytes(s.cfg.AnswerBytesInFlight, s.cfg.DeviceAnswerBytesInFlight)
	s.log.Info("poll answers in flight bounded", "relay_bytes", s.cfg.AnswerBytesInFlight, "device_bytes", s.cfg.DeviceAnswerBytesInFlight,
		"answer_timeout", s.cfg.AnswerTimeout, "answer_min_rate", s.cfg.AnswerMinRate)
	hub := "local"
	if cfg.RelayReplicas > 1 {
		hub = "redis"
	}
	if sw, ok := deps.Store.(interface{ SingleWriter() bool }); !ok || !sw.SingleWriter() {
		s.limits.gates = &gates{}
	}
	m, err := newMetrics(deps.Metrics, s, deps.Store, hub)
	if err != nil {
		return nil, fmt.Errorf("relay: metrics: %w", err)
	}
	s.metrics = m
	s.store = storecalls.Count(deps.Store, m.storeCalls)
	s.readiness = ready.New(s.store.Ping, s.log)
	s.memory = memory.New(memory.Config{
		Store: s.store, AckInterval: cfg.AckInterval, StoreTimeout: cfg.StoreTimeout, Logger: s.log, Now: s.now,
		Hears: s.hub.Hears,
		OnAcks: func(res store.AckManyResult, err error) {
			s.metrics.acked.Add(float64(res.Deleted))
			if err != nil {
				s.logs.ackLog.Do(func() { s.log.Warn("writing acknowledgements failed; retrying", "err", err) })
				s.storeFailed(err)
			}
			if res.Stale > 0 {
				total := s.logs.staleAcks.Add(uint64(res.Stale))
				s.logs.staleAckLog.Do(func() {
					s.log.Warn("acknowledgements taken in an older epoch of the store were dropped, not applied", "stale", res.Stale, "stale_total", total)
				})
				s.watch.Nudge()
			}
		},
	})
	s.watch = memory.NewHistoryCheck(memory.HistoryCheckConfig{
		Store: s.store, Memory: s.memory, Timeout: cfg.StoreTimeout, Logger: s.log,
		Dropped: func(epochChanged bool) {
			s.metrics.memoryDrops.Inc()
			if epochChanged {
				s.metrics.epochChanges.Inc()
				// Every held poll, in its handler or parked, reads its
				// position again and checks its epoch.
				s.hub.NotifyAll()
			}
		},
	})
	s.hub.Observe(s.memory)
	s.hub.PushVia(wake.PushFunc(s.pushTo))
	// Only once the hub tells memory of removals: one committed after the
	// list's read is then heard, and merged into the list
	// (TestRemovalsHeardDuringRead). No test can catch this line moved
	// above Observe: the window it would open is a few instructions wide.
	// The watch after memory, which it drops: its first check, before the
	// relay serves, tells the current epoch.
	services := []service.Service{s.memory, s.watch}
	s.handler = s.routes(s.newPairing())
	if fh, ok := s.hub.(fleet.Hub); ok && cfg.RelayReplicas > 1 {
		s.fleet = fleet.New(s.store, fh, s.log, m.fleetTroubled)
		services = append(services, s.fleet)
	}
	if cfg.EnvelopeTTL > 0 {
		exp, err := expire.New(s.store, cfg.EnvelopeTTL, deps.Metrics, s.log)
		if err != nil {
			return nil, fmt.Errorf("relay: expiry metrics: %w", err)
		}
		services = append(services, exp)
	}
	s.services.Start(services...)
	return s, nil
}

// Handler is the API's http.Handler.
func (s *Server) Handler() http.Handler { return s.handler }

// HeldPolls is how many polls are waiting right now.
func (s *Server) HeldPolls() int64 { return s.limits.held.Load() }

func (s *Server) routes(p *pairing.Pairing) http.Handler {
	r := s.router(p)
	return s.account(s.answerDeadlines(bodyguard.Handler(s.cfg.BodyTimeout, cors.Handler(s.cfg.CORSOrigins, r, s.corsRefused, r))))
}

// routePoll is the poll's route, under which a parked poll's hang-up is
// logged too.
const routePoll = "/v1/poll"

// router is the API's routes: what routes serves, and what the test that
// holds docs/openapi.yaml to the server walks. p nil: pairing is off.
func (s *Server) router(p *pairing.Pairing) chi.Router {
	r := chi.NewRouter()
	// First, so that every answer, the router's own 404 and 405 included,
	// is logged with the route pattern that matched.
	r.Use(noteRoute)
	live := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	}
	// Probes may ask with HEAD (no body is written for it).
	r.Get("/live", live)
	r.Head("/live", live)
	r.Get("/ready", s.ready)
	r.Head("/ready", s.ready)
	r.Post("/v1/register", s.authed(s.register))
	r.Get("/v1/push/vapid", s.vapidKey)
	r.Post("/v1/send", countSends(s.authed(s.send)))
	r.Get(routePoll, timePolls(s.authedHolding(s.poll)))
	r.Get(routeStream, s.authedHolding(s.stream))
	r.Post("/v1/ack", s.authed(s.ack))
	r.Get("/v1/devices", s.authed(s.devices))
	r.Delete("/v1/devices/{device}", s.authed(s.deleteDevice))
	r.Post("/v1/invitations", s.pairingOn(p, s.authed(p.CreateInvitation)))
	r.Get("/v1/invitations", s.pairingOn(p, s.authed(p.ListInvitations)))
	r.Delete("/v1/invitations/{device}", s.pairingOn(p, s.authed(p.CancelInvitation)))
	r.Post("/v1/pair", s.pairingOn(p, s.unauthed(p.Pair)))
	r.Post("/v1/renew", s.pairingOn(p, s.unauthed(p.Renew)))
	if p.On() {
		s.pairPageRoutes(r)
	}
	if s.cfg.Console {
		s.consoleRoutes(r, p)
	}
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, errorf(http.StatusNotFound, codeNotFound, "No such endpoint."))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, errorf(http.StatusMethodNotAllowed, codeBadRequest, "Method not allowed on this endpoint."))
	})
	return r
}

// ready answers /ready: 200 when the relay takes traffic, else 503 and
// why. A load balancer probes it every few seconds, so its 503s are not
// logged each time: each cause logs its own changes, once (shutting down,
// the fleet's watch, the store's probe).
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	if s.readiness.Draining() {
		drain := *errDraining
		drain.Logged = true
		s.writeError(w, r, &drain)
		return
	}
	if s.fleet != nil {
		if err := s.fleet.Ready(time.Now()); err != nil {
			s.writeError(w, r, &httpError{Status: http.StatusServiceUnavailable, Code: codeUnavailable, Message: "Not ready.", Cause: err, Logged: true})
			return
		}
	}
	if err := s.readiness.Store(r.Context()); err != nil {
		msg := "Not ready: the store does not answer."
		if errors.Is(err, store.ErrNotWritable) {
			msg = "Not ready: the store cannot be written; the relay's log says why."
		}
		s.writeError(w, r, &httpError{Status: http.StatusServiceUnavailable, Code: codeUnavailable, Message: msg, Cause: err, Logged: true})
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ready\n"))
}

// maxHeaderBytes bounds a request's head (net/http adds 4 KiB of slack).
const maxHeaderBytes = 16 << 10

// Serve serves on ln until Shutdown. It returns nil after a clean shutdown.
func (s *Server) Serve(ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		// No WriteTimeout: it would cut held polls. Each answer gets a
		// write deadline of its own (answers.go); request bodies get a read
		// deadline in internal/bodyguard.
		// A parked poll's connection comes back with how its wait ended.
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return parking.ConnContext(s.withAnswerTiming(ctx), c)
		},
	}
	s.run.mu.Lock()
	if s.run.shut || s.run.http != nil {
		// Shutdown came first: serve nothing, as if it had come after.
		s.run.mu.Unlock()
		ln.Close()
		if s.run.http != nil {
			return errors.New("relay: Serve called twice")
		}
		<-s.run.done
		return nil
	}
	s.run.http = srv
	s.parking = parking.New(ln.Addr(), srv.MaxHeaderBytes)
	s.run.mu.Unlock()
	ln = answerListener{Listener: ln, log: s.log, cut: s.metrics.answersCut.Inc}
	parked := make(chan error, 1)
	go func() { parked <- srv.Serve(s.parking.Listener()) }()
	err := srv.Serve(ln)
	s.parking.CloseListener()
	perr := <-parked
	if errors.Is(err, http.ErrServerClosed) {
		<-s.run.done
		return nil
	}
	if err == nil && !errors.Is(perr, http.ErrServerClosed) {
		err = perr
	}
	return err
}

// Shutdown drains: new polls get 503, held polls answer at once, sends in
// flight finish; connections still open when ctx ends are closed. It does
// not close the store, hub or push queue, which the caller owns.
func (s *Server) Shutdown(ctx context.Context) error {
	defer close(s.run.done)
	s.readiness.Drain()
	// Held polls never end on their own within the grace period, so the
	// hub is drained first and every waiter answers "come back". Closing
	// may then wait for the hub's own goroutines (Redis's subscriber and
	// heartbeat); that runs beside the HTTP shutdown instead of eating its
	// grace.
	hubClosed := make(chan error, 1)
	go func() { hubClosed <- s.hub.Close() }()
	defer func() {
		if err := <-hubClosed; err != nil {
			s.log.Warn("closing wake hub", "err", err)
		}
	}()
	// The background work stops, the last started first: expiry, the
	// fleet's rounds, then memory, which writes the acknowledgements
	// gathered until the last poll ended.
	defer s.services.Stop()
	// What the access log dropped in its last second is said before exit.
	defer s.logs.access.Flush()

	s.run.mu.Lock()
	s.run.shut = true
	srv, pk := s.run.http, s.parking
	s.run.mu.Unlock()
	if srv == nil {
		return nil
	}
	// Parked polls come back first (the hub, closing, ends their waits),
	// so that the server, still reading, answers them before it stops.
	if err := pk.Close(ctx); err != nil {
		closeErr := srv.Close()
		return fmt.Errorf("relay: parked polls did not come back in time: %w", errors.Join(err, closeErr))
	}
	if err := srv.Shutdown(ctx); err != nil {
		closeErr := srv.Close()
		return fmt.Errorf("relay: shutdown did not finish in time: %w", errors.Join(err, closeErr))
	}
	return nil
}

// corsRefused logs, a line a minute at most, a request from an origin
// FN_CORS_ORIGINS does not allow: its page sees only a failed fetch (the
// browser withholds the answer), so this line is where the mistake shows,
// typically localhost against 127.0.0.1, or a port left out.
func (s *Server) corsRefused(origin string) {
	total := s.logs.corsRefused.Add(1)
	s.logs.corsRefusedLog.Do(func() {
		allowed := strings.Join(s.cfg.CORSOrigins, " ")
		if allowed == "" {
			allowed = "(none)"
		}
		s.log.Warn("a request from another origin was refused: browsers withhold the answer from its page; to allow it, add its origin, exactly, to FN_CORS_ORIGINS",
			"origin", origin, "allowed", allowed, "refused_total", total)
	})
}
