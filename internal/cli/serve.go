package cli

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	goredis "github.com/redis/go-redis/v9"

	"github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/internal/fdlimit"
	"github.com/flamenet/relay/internal/linebuf"
	"github.com/flamenet/relay/internal/memlimit"
	"github.com/flamenet/relay/push"
	"github.com/flamenet/relay/relay"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/store/postgres"
	"github.com/flamenet/relay/store/sqlite"
	"github.com/flamenet/relay/wake"
	"github.com/flamenet/relay/wake/local"
	wakeredis "github.com/flamenet/relay/wake/redis"
)

// loadConfig reads a command's flags and the FN_* environment: the
// settings envs names, or every one. about is the command's one-sentence
// description; its usage (-h) goes to stdout.
func loadConfig(name, about string, args []string, getenv func(string) string, stdout io.Writer, envs ...string) (config.Config, error) {
	fs := flags(name, "[flags]", about+"\n\nEvery flag also reads its FN_* variable; a flag wins over the variable.", stdout)
	cfg, err := config.LoadOnly(fs, args, getenv, envs...)
	if err != nil {
		return config.Config{}, err
	}
	if fs.NArg() > 0 {
		return config.Config{}, usageErr("%s: unexpected argument %q", name, fs.Arg(0))
	}
	return cfg, nil
}

// newLogger logs in FN_LOG_FORMAT at FN_LOG_LEVEL. Durations are written
// as Go duration strings ("1.5s"), which people and log queries read, not
// as nanoseconds.
func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindDuration {
			a.Value = slog.StringValue(a.Value.Duration().String())
		}
		return a
	}}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// accessLogDelay is the longest an access log line waits to be written.
const accessLogDelay = 100 * time.Millisecond

// relayConfig returns what the server takes of the configuration.
func relayConfig(c config.Config, keys []ed25519.PublicKey, heldPolls int) relay.Config {
	return relay.Config{
		IssuerKeys:          keys,
		IssuerKey:           c.IssuerKey,
		InviteTTL:           c.InviteTTL,
		AccessTokenTTL:      c.AccessTokenTTL,
		RenewalTTL:          c.RenewalTTL,
		PublicURL:           c.PublicURL,
		VAPIDPublicKey:      c.VAPIDPublicKey,
		PairRatePerAddress:  c.PairRatePerAddress,
		PairRate:            c.PairRate,
		PollBudgetBytes:     c.PollBudgetBytes,
		MaxEnvelopeBytes:    c.MaxEnvelopeBytes,
		MaxWait:             c.MaxWait,
		MaxRecipients:       c.MaxRecipients,
		MaxPendingEnvelopes: c.MaxPendingEnvelopes,
		MaxPendingBytes:     c.MaxPendingBytes,
		StoreTimeout:        c.StoreTimeout,
		LockTimeout:         c.LockTimeout,
		BodyTimeout:         c.BodyTimeout,
		AckInterval:         c.AckInterval,
		EnvelopeTTL:         c.EnvelopeTTL,
		RelayReplicas:       c.RelayReplicas,
		SendInflight:        c.SendInflight,
		SendRate:            c.SendRate,
		SendBurst:           c.SendBurst,
		HouseholdSendRate:   c.HouseholdSendRate,
		HouseholdSendBurst:  c.HouseholdSendBurst,
		DevicePollRate:      c.DevicePollRate,
		DevicePollBurst:     c.DevicePollBurst,
		MaxHouseholdPending: c.MaxHouseholdPending,
		MaxHeldPolls:        heldPolls,
		AccessLog:           c.AccessLog,
		ParkPolls:           c.ParkPolls,
		TrustedProxies:      c.TrustedProxies,
		CORSOrigins:         c.CORSOrigins,
		Console:             c.Console,
		StreamLife:          c.StreamLife,

		AnswerTimeout:             c.AnswerTimeout,
		AnswerMinRate:             c.AnswerMinRate,
		AnswerBytesInFlight:       c.AnswerBytesInFlight,
		DeviceAnswerBytesInFlight: c.DeviceAnswerBytesInFlight,
	}
}

func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := loadConfig("serve", "Runs the relay until SIGINT or SIGTERM, when it drains and stops.", args, getenv, stdout)
	if err != nil {
		return err
	}
	// The access log's lines reach stderr in batches, at most
	// accessLogDelay late; any other line first writes those before it,
	// and the last are written when serve returns.
	accessOut := linebuf.New(stderr, accessLogDelay, 64<<10)
	defer accessOut.Close()
	log := newLogger(cfg, accessOut.Through())

	keys := cfg.IssuerKeys
	var minted ed25519.PrivateKey
	if len(keys) == 0 {
		key, created, err := loadOrCreateIssuerKey(cfg.IssuerKeyFile)
		if err != nil {
			return fmt.Errorf("FN_ISSUER_KEY_FILE: %w", err)
		}
		if created {
			log.Info("created an issuer key", "file", cfg.IssuerKeyFile)
		} else if fi, err := os.Stat(cfg.IssuerKeyFile); err == nil && fi.Mode().Perm()&0o077 != 0 {
			// Not refused: secret mounts are often 0644 by default. But
			// whoever reads it mints tokens for every household.
			log.Warn("the issuer key file may be read by other users of this machine, who could then mint tokens for every household: make it mode 0600 (or 0400), owned by the relay's user",
				"file", cfg.IssuerKeyFile, "mode", fmt.Sprintf("%04o", fi.Mode().Perm()))
		}
		keys = []ed25519.PublicKey{key.Public().(ed25519.PublicKey)}
		minted = key
		cfg.IssuerKey = key // the relay mints its devices' tokens: pairing is on
	}

	reg := prometheus.NewRegistry()
	bld := readBuild()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfoGauge(bld))
	heldPolls := heldPollCap(cfg, log)
	memoryTarget(getenv, log)

	st, err := openBackend(ctx, cfg, log, true)
	if err != nil {
		return err
	}
	defer func() {
		if st != nil {
			st.Close()
		}
	}()
	hub, closeHub, err := openHub(ctx, cfg, log, reg)
	if err != nil {
		return err
	}
	defer closeHub()

	vapid, err := loadVAPID(cfg, log)
	if err != nil {
		return err
	}
	pushCfg := pushConfig(cfg, log)
	pushCfg.Registerer = reg
	pushCfg.WebPush.VAPID = vapid
	if vapid != nil {
		cfg.VAPIDPublicKey = vapid.PublicKey()
	}
	pq, err := push.New(pushCfg, func(ctx context.Context, j push.Job) {
		// The provider said the target is gone: forget it, unless the
		// device registered another one meanwhile.
		if err := st.ClearPush(ctx, j.Household, j.Device, j.Target); err != nil {
			log.Warn("clearing a gone push target", "err", err)
		}
	})
	if err != nil {
		return fmt.Errorf("push settings: %w", err)
	}
	defer pq.Close(context.Background()) // a no-op after the drain below
	srv, err := relay.New(relayConfig(cfg, keys, heldPolls), relay.Deps{
		Store: st, Hub: hub, Push: pq, Logger: log.With("component", "api"), Metrics: reg,
		AccessLogger: newLogger(cfg, accessOut).With("component", "api"),
	})
	if err != nil {
		return err
	}
	bg, stopBackground := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopBackground()
	if cfg.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		addr, err := serveSide(bg, &wg, cfg.MetricsAddr, mux)
		if err != nil {
			return fmt.Errorf("FN_METRICS_ADDR: %w", err)
		}
		log.Info("metrics", "addr", "http://"+addr+"/metrics")
	}
	if cfg.PprofAddr != "" {
		// Apart from the metrics, which are scraped across the cluster:
		// profiles disclose memory and can cost CPU on demand.
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		addr, err := serveSide(bg, &wg, cfg.PprofAddr, mux)
		if err != nil {
			return fmt.Errorf("FN_PPROF_ADDR: %w", err)
		}
		log.Info("pprof", "addr", "http://"+addr+"/debug/pprof/")
	}

	// Listen first, so a bind error returns at once and the address is
	// known before anything is served.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("FN_LISTEN: %w", err)
	}
	addr := ln.Addr().String()
	log.Info("serving", "addr", "http://"+addr, "store", string(cfg.Database.Kind), "version", bld.Version)
	if cfg.Console {
		log.Info("console", "url", "http://"+addr+"/console/")
	}
	if minted != nil {
		welcome(cfg.LogFormat, stdout, log, addr, cfg.IssuerKeyFile, selfCommand(os.Args[0]), cfg.Console)
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down", "grace", cfg.ShutdownGrace)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	shutdownErr := srv.Shutdown(sctx)
	if err := <-errc; err != nil {
		return err
	}
	if shutdownErr != nil {
		log.Warn("shutdown grace ran out; closed remaining connections", "err", shutdownErr)
	}
	// Pushes in flight get what is left of the grace; the rest are dropped
	// and counted (their envelopes wait for the next poll).
	pq.Close(sctx)
	err = st.Close()
	st = nil
	if err != nil {
		return fmt.Errorf("closing store: %w", err)
	}
	log.Info("stopped")
	return nil
}

// serveSide serves h on addr until bg ends, for the side listeners
// (metrics, profiles), and returns the address it listens on.
func serveSide(bg context.Context, wg *sync.WaitGroup, addr string, h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	wg.Add(2)
	go func() { defer wg.Done(); _ = srv.Serve(ln) }()
	go func() { defer wg.Done(); <-bg.Done(); srv.Close() }()
	return ln.Addr().String(), nil
}

func pushConfig(cfg config.Config, log *slog.Logger) push.Config {
	return push.Config{
		Workers:               cfg.PushWorkers,
		QueueSize:             cfg.PushQueue,
		HouseholdInFlight:     cfg.PushHouseholdFlight,
		HouseholdQueue:        cfg.PushHouseholdQueue,
		ResponseHeaderTimeout: cfg.PushHeaderTimeout,
		AttemptTimeout:        cfg.PushAttemptTimeout,
		Timeout:               cfg.PushTimeout,
		AllowPrivate:          cfg.PushAllowPrivate,
		APNs: push.APNsConfig{KeyFile: cfg.APNsKeyFile, KeyID: cfg.APNsKeyID, TeamID: cfg.APNsTeamID, Topic: cfg.APNsTopic, URL: cfg.APNsURL,
			AlertText: cfg.APNsAlertText},
		FCM:    push.FCMConfig{CredentialsFile: cfg.FCMCredentialsFile, URL: cfg.FCMURL, TokenURL: cfg.FCMTokenURL},
		Logger: log,
	}
}

// openStore opens the backend FN_DATABASE_URL names, for relay migrate,
// which may run beside a relay that serves it.
func openStore(ctx context.Context, cfg config.Config, log *slog.Logger) (store.Store, error) {
	return openBackend(ctx, cfg, log, false)
}

// openBackend opens the backend FN_DATABASE_URL names; serving: for relay
// serve, which must be the only relay on a SQLite database.
func openBackend(ctx context.Context, cfg config.Config, log *slog.Logger, serving bool) (store.Store, error) {
	if cfg.Database.Kind == config.SQLite {
		db, err := sqlite.Open(ctx, sqlite.Config{Path: cfg.Database.Path, Synchronous: cfg.SQLiteSynchronous, Logger: log, Serve: serving})
		if err != nil {
			return nil, fmt.Errorf("FN_DATABASE_URL: %w", err)
		}
		return db, nil
	}
	db, err := postgres.Open(ctx, postgres.Config{URL: cfg.Database.DSN, MaxConns: int32(cfg.PostgresPoolSize()), LockTimeout: cfg.LockTimeout, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("FN_DATABASE_URL: %w", err)
	}
	return db, nil
}

// openHub picks the wake hub: in-process for one relay, Redis pub/sub for
// several. With Redis it refuses to start, with one line, when Redis
// answers that FN_REDIS_URL's settings are wrong; a Redis that is merely
// down lets the relay start, its held polls re-reading the store until
// Redis answers (see wake/redis.New).
// The returned func releases what the hub holds after the server has shut
// down (the server closes the hub itself while draining).
func openHub(ctx context.Context, cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (wake.Hub, func() error, error) {
	if cfg.RelayReplicas <= 1 {
		return local.New(nil), func() error { return nil }, nil
	}
	wakeredis.RouteLogs(log.With("component", "redis"))
	client, err := wakeredis.NewClient(cfg.RedisURL, cfg.RedisPoolSize())
	if err != nil {
		return nil, nil, fmt.Errorf("FN_REDIS_URL: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, redisStartTimeout)
	defer cancel()
	hub, err := wakeredis.New(ctx, client, wakeredis.Config{Prefix: cfg.RedisChannelPrefix, Logger: log, Registerer: reg})
	if err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("FN_REDIS_URL: %w", err)
	}
	reg.MustRegister(redisPoolCollector{client})
	return hub, func() error {
		_ = hub.Close() // a no-op after the drain; stops it if serve failed before
		return client.Close()
	}, nil
}

// redisStartTimeout bounds the start-up check of Redis and the first
// subscription.
const redisStartTimeout = 5 * time.Second

// memoryTarget gives the Go runtime a memory target of 90% of the
// container's memory limit, unless GOMEMLIMIT says otherwise: held polls
// are many and small, and without a target the heap may grow to twice
// what is live before the collector runs, past the limit.
func memoryTarget(getenv func(string) string, log *slog.Logger) {
	if getenv("GOMEMLIMIT") != "" {
		return
	}
	if limit := memlimit.Limit(); limit > 0 {
		debug.SetMemoryLimit(limit / 10 * 9)
		log.Info("memory target set from the container's limit", "limit_bytes", limit, "target_bytes", limit/10*9)
	}
}

// heldPollCap raises the open-file limit and returns FN_MAX_HELD_POLLS, or
// when that is unset, what the limit leaves room for. It warns when the
// limit is too low for the settings.
func heldPollCap(cfg config.Config, log *slog.Logger) int {
	limit, err := fdlimit.Raise()
	if err != nil {
		log.Warn("could not raise the open-file limit", "err", err)
	}
	// A held poll costs its socket, in every mode: with Redis it holds no
	// connection there.
	b := fdlimit.Budget{PerPoll: 1, Reserved: cfg.SendInflight + 64}
	if cfg.Database.Kind == config.SQLite {
		b.Reserved += 16
	} else {
		b.Reserved += cfg.PostgresPoolSize() + 1
	}
	if cfg.RelayReplicas > 1 {
		// The publish pool and the subscriber connections (one per
		// master with a Cluster; 16 covers most).
		b.Reserved += cfg.RedisPoolSize() + wakeredis.DefaultShards
	}
	fits := max(b.HeldPolls(limit), 1)
	const comfortable = 10000
	switch {
	case cfg.MaxHeldPolls > fits:
		log.Warn("the open-file limit is too low for FN_MAX_HELD_POLLS; raise it (ulimit -n, LimitNOFILE, ulimits: nofile)",
			"nofile", limit, "needed", b.Need(cfg.MaxHeldPolls), "max_held_polls", cfg.MaxHeldPolls)
		return cfg.MaxHeldPolls
	case cfg.MaxHeldPolls > 0:
		return cfg.MaxHeldPolls
	case fits < comfortable:
		log.Warn("the open-file limit leaves room for few held polls; past them polls get 503 overloaded. Raise it (ulimit -n, LimitNOFILE, ulimits: nofile)",
			"nofile", limit, "held_polls", fits, "needed_for_10000", b.Need(comfortable))
	}
	return fits
}

// redisPoolCollector exports the Redis client's command pool, which
// publishes wake-ups (the subscriber connections are outside it).
type redisPoolCollector struct{ c goredis.UniversalClient }

var (
	redisTotalDesc    = prometheus.NewDesc("fn_redis_pool_connections", "Redis publish pool connections open now.", nil, nil)
	redisIdleDesc     = prometheus.NewDesc("fn_redis_pool_idle_connections", "Redis publish pool connections idle now.", nil, nil)
	redisTimeoutsDesc = prometheus.NewDesc("fn_redis_pool_timeouts_total", "Waits for a Redis publish pool connection that timed out (pool exhausted).", nil, nil)
)

func (r redisPoolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- redisTotalDesc
	ch <- redisIdleDesc
	ch <- redisTimeoutsDesc
}

func (r redisPoolCollector) Collect(ch chan<- prometheus.Metric) {
	st := r.c.PoolStats()
	ch <- prometheus.MustNewConstMetric(redisTotalDesc, prometheus.GaugeValue, float64(st.TotalConns))
	ch <- prometheus.MustNewConstMetric(redisIdleDesc, prometheus.GaugeValue, float64(st.IdleConns))
	ch <- prometheus.MustNewConstMetric(redisTimeoutsDesc, prometheus.CounterValue, float64(st.Timeouts))
}

// welcome tells whoever started the relay how to pair a device and how to
// mint a token with the key it trusts: as text on stdout for a person at a
// terminal, or as one log line when the logs are JSON, so that a log
// collector reading the output sees nothing but JSON. The commands name
// this binary as it was started (self) and the key file by its absolute
// path, so that they work pasted into another terminal.
func welcome(format string, w io.Writer, log *slog.Logger, addr, keyFile, self string, console bool) {
	if abs, err := filepath.Abs(keyFile); err == nil {
		keyFile = abs
	}
	url := "http://" + addr
	invite := fmt.Sprintf("%s invite -url %s -issuer-key-file %s -device phone", self, url, shellQuote(keyFile))
	mint := fmt.Sprintf("%s token -issuer-key-file %s -household home -device phone", self, shellQuote(keyFile))
	if format == "json" {
		log.Info("trusting the issuer key in key_file; pair a device with: "+invite+"; or mint a device token with: "+mint,
			"key_file", keyFile, "addr", url)
		return
	}
	fmt.Fprintf(w, `
The relay trusts the issuer key in %s
and mints its devices' tokens with it.

Pair a device: this prints a single-use code, a link and a QR code
for the device to redeem:

  %s

Or mint a device token yourself, and from another terminal:

  TOKEN=$(%s)
  curl -s -X POST -H "Authorization: Bearer $TOKEN" %s/v1/register

`, keyFile, invite, mint, url)
	if console {
		fmt.Fprintf(w, `The household console is at %s/console/. Pair the browser there,
as an admin device, with the code this prints:

  %s invite -url %s -issuer-key-file %s -household home -device browser -scope admin

`, url, self, url, shellQuote(keyFile))
	}
}

// selfCommand returns how to run this binary again, from its argv[0]: "go run ."
// when go run built it, else argv[0] as typed.
func selfCommand(arg0 string) string {
	if goRunBuilt(arg0) {
		return "go run ."
	}
	return shellQuote(arg0)
}

// cacheEntry is the end of a build cache entry's directory, GOCACHE/xx/HASH-d,
// where go run keeps what it built and runs it from, from the second run on.
var cacheEntry = regexp.MustCompile(`(^|/)[0-9a-f]{2}/[0-9a-f]{64}-d$`)

// goRunBuilt: arg0 is where go run puts what it builds: a temporary
// go-build directory on a first run, the build cache after. The cache is
// found by its default place, or wherever GOCACHE is, by its entries' shape.
func goRunBuilt(arg0 string) bool {
	dir := filepath.Dir(arg0)
	if strings.Contains(filepath.ToSlash(arg0), "/go-build") && filepath.Base(dir) == "exe" {
		return true
	}
	if cache, err := os.UserCacheDir(); err == nil && strings.HasPrefix(arg0, filepath.Join(cache, "go-build")+string(filepath.Separator)) {
		return true
	}
	return cacheEntry.MatchString(filepath.ToSlash(dir))
}

// shellQuote quotes s for a POSIX shell when it needs quoting.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=+,@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
