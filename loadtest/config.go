package main

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	relayconfig "github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/internal/hapg"
	"github.com/flamenet/relay/loadtest/internal/faults"
	"github.com/flamenet/relay/loadtest/internal/hostile"
	"github.com/flamenet/relay/loadtest/internal/stack"
)

type config struct {
	urls        []string // empty: boot a throwaway stack
	issuerSeed  string   // base64 raw Ed25519 seed, for -url
	pairs       int
	rate        float64
	duration    time.Duration
	wait        int
	payload     int
	codec       string
	herd        bool
	drain       time.Duration
	out         string
	name        string
	store       string
	pg          string
	replicas    int
	redis       string
	allowRemote bool
	metricsURLs []string
	relayBin    string
	relayCommit string // the commit relayBin was built from, as told
	src         string
	progress    time.Duration
	late        time.Duration

	// crashes are when, after the first scheduled send, the throwaway
	// relays are killed and restarted; crashReplica is the one killed, or
	// -1 for every one.
	crashes      []time.Duration
	crashReplica int
	crashDown    time.Duration // how long a killed relay stays down
	ackMode      string        // "cursor" or "explicit"
	stream       bool          // recipients hold streams instead of polls
	hop          float64       // chance a recipient's next poll or stream goes to another relay
	hostile      int           // hostile connections beside the load
	slowReaders  int           // with hostile: connections of one token that never read
	hostileKinds string        // with hostile: "all" kinds, or "pairing" only
	renewers     int           // devices paired before the run that renew throughout it
	relayMemory  int64         // bytes; 0: no cap
	relayEnv     []string
	// relay is the configuration the throwaway relays run with, read by
	// the relay's own config package from relayEnv.
	relay       relayconfig.Config
	sourceAddrs int // loopback source addresses for the pairs' connections; 0: as needed

	// faults is a fault campaign's seed; nil: no campaign.
	faults     *uint64
	faultKinds []string
	faultGap   time.Duration

	// failover is the replication ("sync" or "async") of the Postgres
	// formation whose primary is killed at failoverAt; "": none.
	failover   string
	failoverAt time.Duration

	// command is the invocation, secrets removed, for the report.
	command []string
}

// envFor names the LOAD_* variable behind each flag; a flag given on the
// command line wins over its variable (the config package binds them, as it
// does the relay's FN_* settings).
var envFor = map[string]string{
	"url":           "LOAD_URL",
	"issuer-key":    "LOAD_ISSUER_PRIVATE_KEY",
	"pairs":         "LOAD_PAIRS",
	"rate":          "LOAD_RATE",
	"duration":      "LOAD_DURATION",
	"wait":          "LOAD_WAIT",
	"payload":       "LOAD_PAYLOAD",
	"codec":         "LOAD_CODEC",
	"herd":          "LOAD_HERD",
	"drain":         "LOAD_DRAIN",
	"out":           "LOAD_OUT",
	"name":          "LOAD_NAME",
	"store":         "LOAD_STORE",
	"pg":            "LOAD_PG",
	"replicas":      "LOAD_REPLICAS",
	"redis":         "LOAD_REDIS",
	"allow-remote":  "LOAD_ALLOW_REMOTE",
	"metrics-url":   "LOAD_METRICS_URL",
	"relay-bin":     "LOAD_RELAY_BIN",
	"relay-commit":  "LOAD_RELAY_COMMIT",
	"src":           "LOAD_SRC",
	"progress":      "LOAD_PROGRESS",
	"crash":         "LOAD_CRASH",
	"crash-replica": "LOAD_CRASH_REPLICA",
	"crash-down":    "LOAD_CRASH_DOWN",
	"ack":           "LOAD_ACK",
	"stream":        "LOAD_STREAM",
	"hop":           "LOAD_HOP",
	"hostile":       "LOAD_HOSTILE",
	"slow-readers":  "LOAD_SLOW_READERS",
	"hostile-kinds": "LOAD_HOSTILE_KINDS",
	"renewers":      "LOAD_RENEWERS",
	"relay-memory":  "LOAD_RELAY_MEMORY",
	"relay-env":     "LOAD_RELAY_ENV",
	"source-addrs":  "LOAD_SOURCE_ADDRS",
	"faults":        "LOAD_FAULTS",
	"fault-kinds":   "LOAD_FAULT_KINDS",
	"fault-gap":     "LOAD_FAULT_GAP",
	"failover":      "LOAD_FAILOVER",
	"failover-at":   "LOAD_FAILOVER_AT",
}

// campaignDefaults are what -faults changes of the defaults of flags not
// given: a few relays on Postgres under a steady, modest load, with polls
// short enough that every device comes back often, and often to another
// relay, so that faults meet devices on the move.
var campaignDefaults = map[string]string{
	"store": "postgres", "replicas": "3", "pairs": "160", "rate": "30", "wait": "5", "hop": "0.3",
}

// secret flags never reach the report.
var secret = map[string]bool{"issuer-key": true}

// flagOf is the flag of a LOAD_* variable.
func flagOf(env string) string {
	for f, e := range envFor {
		if e == env {
			return f
		}
	}
	return ""
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (*config, error) {
	c := &config{
		duration: 60 * time.Second,
		progress: 5 * time.Second,
		late:     10 * time.Millisecond,
		drain:    -1, // wait+10s once -wait is known

		crashReplica: -1,
	}
	var urls, metrics string
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&urls, "url", "", "target relay URL(s), comma-separated; empty boots a throwaway stack")
	fs.StringVar(&c.issuerSeed, "issuer-key", "", "base64 raw Ed25519 seed the target trusts (needed with -url)")
	fs.IntVar(&c.pairs, "pairs", 1000, "sender/recipient pairs; each recipient holds one poll")
	fs.Float64Var(&c.rate, "rate", 100, "sends per second over all pairs")
	fs.Var((*seconds)(&c.duration), "duration", "how long sends are offered (60s, or bare seconds)")
	fs.IntVar(&c.wait, "wait", 20, "poll wait in seconds")
	fs.IntVar(&c.payload, "payload", 256, "payload bytes per send")
	fs.StringVar(&c.codec, "codec", "json", "json or msgpack")
	fs.BoolVar(&c.herd, "herd", false, "start every recipient's first poll at the same instant, and the sends once the relays hold them all")
	fs.Var((*seconds)(&c.drain), "drain", "how long to wait for stragglers after the last send (default wait+10s)")
	fs.StringVar(&c.out, "out", "", "write the JSON report here")
	fs.StringVar(&c.name, "name", "", "scenario name in the report (default: -out's base name)")
	fs.StringVar(&c.store, "store", "", "throwaway stack's store: sqlite or postgres (default sqlite; a label with -url)")
	fs.StringVar(&c.pg, "pg", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "Postgres server in which -store postgres creates its throwaway database")
	fs.IntVar(&c.replicas, "replicas", 1, "relays in the throwaway stack; above 1 they wake each other through Redis")
	fs.StringVar(&c.redis, "redis", "redis://127.0.0.1:6379", "Redis for -replicas above 1")
	fs.BoolVar(&c.allowRemote, "allow-remote", false, "allow a -url that is not a loopback address")
	fs.StringVar(&metrics, "metrics-url", "", "relay metrics URL(s), comma-separated, for CPU and memory of a relay this tool did not start (and, with several, each relay's Redis wake-ups)")
	fs.StringVar(&c.relayBin, "relay-bin", "", "use this relay binary instead of building one")
	fs.StringVar(&c.relayCommit, "relay-commit", "", "with -relay-bin: the commit it was built from, for the report (default: the checkout's)")
	fs.StringVar(&c.src, "src", "", "relay checkout to build and to describe in the report (default: the module around the working directory)")
	fs.Var((*seconds)(&c.progress), "progress", "interval of the progress line on stderr")
	fs.Var((*durationList)(&c.crashes), "crash", "kill the throwaway relays with SIGKILL this long after the first send and restart them on the same data and port (repeatable, or a comma-separated list)")
	fs.IntVar(&c.crashReplica, "crash-replica", -1, "with -crash, kill only this replica (0-based); -1 kills every one")
	fs.StringVar(&c.failover, "failover", "", "sync or async: put the throwaway relays on a pg_auto_failover formation of the tester's own (a monitor, a primary and a standby, replicating so) and kill the primary mid-run for the monitor to promote the standby; implies -store postgres")
	fs.Var((*seconds)(&c.failoverAt), "failover-at", "with -failover, when the primary is killed after the first send (default a third of -duration)")
	fs.Var((*seconds)(&c.crashDown), "crash-down", "with -crash, how long a killed relay stays down before it is started again, as a supervisor's restart delay would keep it")
	fs.StringVar(&c.ackMode, "ack", "cursor", "how recipients acknowledge: cursor (each poll carries the last cursor) or explicit (POST /v1/ack, then poll without a cursor)")
	fs.BoolVar(&c.stream, "stream", false, "recipients hold streams (GET /v1/stream) instead of polls, acknowledging as the relay's own clients do: at an event or ping once a minute has passed since the last ack, at once when 1,000 seqs are unacknowledged, and by the next stream's cursor (with -ack explicit: each batch)")
	fs.Float64Var(&c.hop, "hop", 0, "with several relays, the chance (0 to 1) that a recipient's next poll or stream goes to another relay, drawn at random, than its last; above 0 each send goes to a relay drawn at random too (at 0 each pair sends on one relay, its recipient polls on another)")
	fs.IntVar(&c.hostile, "hostile", 0, "hostile connections that flood the relay beside the load for the offered duration")
	fs.StringVar(&c.hostileKinds, "hostile-kinds", "all", "with -hostile, the kinds of request: all, or pairing (only those against the pairing endpoints, which take no token)")
	fs.IntVar(&c.renewers, "renewers", 0, "devices paired through the relay's own pairing before the run, each renewing its credentials every 5 s throughout it, from the hostile connections' source addresses: every renewal must succeed (needs a relay that holds the issuer key)")
	fs.IntVar(&c.slowReaders, "slow-readers", 600, "with -hostile, connections of one device token that poll with about 2 MiB waiting and never read, in rounds over the offered duration (0: none)")
	fs.Var((*byteSize)(&c.relayMemory), "relay-memory", "cap each throwaway relay's memory (256MiB, 1GiB or bytes): GOMEMLIMIT and a kernel-enforced limit")
	fs.Var((*envList)(&c.relayEnv), "relay-env", "KEY=VALUE added to each throwaway relay's environment (repeatable; LOAD_RELAY_ENV takes several separated by spaces)")
	fs.IntVar(&c.sourceAddrs, "source-addrs", 0, "spread the pairs' connections over this many loopback source addresses (127.0.0.1, .2, ...); 0: as many as the ephemeral ports need")
	fs.Var(seedFlag{&c.faults}, "faults", "run a fault campaign drawn from this seed (0 to 2^64-1): relays, a Postgres and a Redis of the stack's own killed, paused and restarted, recipients removed and registered again, clients crashed, under the load; the same seed and flags replay the same plan. Unless given, -store postgres -replicas 3 -pairs 160 -rate 30 -wait 5 -hop 0.3")
	fs.Var((*kindList)(&c.faultKinds), "fault-kinds", "with -faults, the kinds of fault drawn, comma-separated (default every one: "+strings.Join(faults.FaultKinds, ",")+")")
	c.faultGap = time.Second
	fs.Var((*seconds)(&c.faultGap), "fault-gap", "with -faults, the mean time between the starts of two faults")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: loadtest [flags]\n\nEach flag also reads its LOAD_* variable (the flag wins):")
		fs.VisitAll(func(f *flag.Flag) {
			def := ""
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "-1ns" {
				def = " (default " + f.DefValue + ")"
			}
			fmt.Fprintf(fs.Output(), "  -%s (%s)\n    \t%s%s\n", f.Name, envFor[f.Name], f.Usage, def)
		})
	}

	fromEnv, err := relayconfig.Parse(fs, args, getenv, func(f string) string { return envFor[f] })
	if err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, kv := range fromEnv {
		name, _, _ := strings.Cut(kv, "=")
		given[flagOf(name)] = true
	}
	if c.faults != nil {
		for name, v := range campaignDefaults {
			if !given[name] {
				if err := fs.Set(name, v); err != nil {
					return nil, err
				}
			}
		}
		if given["pg"] || given["redis"] {
			return nil, errors.New("-faults starts a Postgres and a Redis of its own, which it kills and pauses; -pg and -redis cannot be given with it")
		}
		if len(c.faultKinds) == 0 {
			c.faultKinds = slices.Clone(faults.FaultKinds)
		}
	}
	if c.failover != "" && given["pg"] {
		return nil, errors.New("-failover starts the Postgres formation whose primary it kills; -pg cannot be given with it")
	}
	fromEnv = slices.DeleteFunc(fromEnv, func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return secret[flagOf(name)]
	})
	c.urls = splitList(urls)
	c.metricsURLs = splitList(metrics)
	c.command = append(append(fromEnv, "loadtest"), redact(args)...)
	if c.name == "" && c.out != "" {
		c.name = strings.TrimSuffix(filepath.Base(c.out), ".json")
	}
	if c.drain < 0 {
		c.drain = time.Duration(c.wait+10) * time.Second
	}
	return c, c.validate()
}

func (c *config) validate() error {
	var errs []error
	if c.pairs < 1 {
		errs = append(errs, errors.New("-pairs must be at least 1"))
	}
	if c.rate <= 0 {
		errs = append(errs, errors.New("-rate must be above 0"))
	}
	if c.duration <= 0 || c.rate*c.duration.Seconds() < 1 {
		errs = append(errs, errors.New("-duration times -rate must come to at least one send"))
	}
	if c.wait < 0 {
		errs = append(errs, errors.New("-wait must be 0 or more"))
	}
	if c.payload < 1 || c.payload > 65536 {
		errs = append(errs, errors.New("-payload must be 1 to 65536 bytes"))
	}
	if c.codec != "json" && c.codec != "msgpack" {
		errs = append(errs, fmt.Errorf("-codec %q: want json or msgpack", c.codec))
	}
	if c.progress <= 0 {
		errs = append(errs, errors.New("-progress must be above 0"))
	}
	if c.ackMode != "cursor" && c.ackMode != "explicit" {
		errs = append(errs, fmt.Errorf("-ack %q: want cursor or explicit", c.ackMode))
	}
	if c.crashDown < 0 {
		errs = append(errs, errors.New("-crash-down must be 0 or more"))
	}
	if c.hostile < 0 {
		errs = append(errs, errors.New("-hostile must be 0 or more"))
	}
	if c.renewers < 0 || c.renewers > 1000 {
		errs = append(errs, errors.New("-renewers must be 0 to 1000"))
	}
	if c.renewers > 0 && c.replicas > 1 && len(c.urls) == 0 {
		errs = append(errs, errors.New("-renewers needs a relay that pairs: a throwaway stack of one relay (its relays above one trust the key, they do not hold it)"))
	}
	if c.slowReaders < 0 {
		errs = append(errs, errors.New("-slow-readers must be 0 or more"))
	}
	if hostile.KindNames(c.hostileKinds) == nil {
		errs = append(errs, fmt.Errorf("-hostile-kinds %q: want all or pairing", c.hostileKinds))
	}
	if c.sourceAddrs < 0 || c.sourceAddrs > 254 {
		errs = append(errs, errors.New("-source-addrs must be 0 to 254"))
	}
	for _, at := range c.crashes {
		if at <= 0 || at >= c.duration {
			errs = append(errs, fmt.Errorf("-crash %s: must fall inside the offered duration (0 to %s)", at, c.duration))
		}
	}
	if c.faults != nil {
		errs = append(errs, c.validateCampaign()...)
	} else if len(c.faultKinds) > 0 {
		errs = append(errs, errors.New("-fault-kinds needs -faults"))
	}
	if c.relayMemory != 0 && c.relayMemory < 16<<20 {
		errs = append(errs, errors.New("-relay-memory must be at least 16MiB"))
	}
	for _, kv := range c.relayEnv {
		k, _, _ := strings.Cut(kv, "=")
		if stackOwned[k] {
			errs = append(errs, fmt.Errorf("-relay-env %s: the throwaway stack sets %s itself", kv, k))
		} else if _, ok := relayconfig.Lookup(k); !ok && strings.HasPrefix(k, "FN_") {
			errs = append(errs, fmt.Errorf("-relay-env %s: the relay has no setting %s", kv, k))
		}
	}
	relay, err := relayconfig.FromEnv(func(k string) string { return c.relaySetting(k, "") })
	if err != nil {
		errs = append(errs, fmt.Errorf("-relay-env: %w", err))
	}
	c.relay = relay
	errs = append(errs, c.validateFailover()...)
	if len(c.urls) == 0 {
		switch c.store {
		case "":
			c.store = "sqlite"
		case "sqlite", "postgres":
		default:
			errs = append(errs, fmt.Errorf("-store %q: want sqlite or postgres", c.store))
		}
		if db, err := relayconfig.ParseDatabaseURL(c.pg); c.store == "postgres" && (err != nil || db.Kind != relayconfig.Postgres) {
			errs = append(errs, fmt.Errorf("-pg %q: want a postgres:// URL", stack.RedactURL(c.pg)))
		}
		if c.replicas < 1 {
			errs = append(errs, errors.New("-replicas must be at least 1"))
		}
		if c.replicas > 1 && c.store == "sqlite" {
			errs = append(errs, errors.New("-replicas above 1 needs -store postgres: one SQLite file is for one relay"))
		}
		if len(c.crashes) > 0 && (c.crashReplica < -1 || c.crashReplica >= c.replicas) {
			errs = append(errs, fmt.Errorf("-crash-replica %d: want -1 (every one) or 0 to %d", c.crashReplica, c.replicas-1))
		}
	} else {
		if c.store == "" {
			c.store = "external"
		}
		c.replicas = len(c.urls)
		// These act on processes this tool owns.
		if len(c.crashes) > 0 {
			errs = append(errs, errors.New("-crash needs a throwaway stack: it kills and restarts the relays it started"))
		}
		if c.relayMemory != 0 {
			errs = append(errs, errors.New("-relay-memory needs a throwaway stack"))
		}
		if len(c.relayEnv) > 0 {
			errs = append(errs, errors.New("-relay-env needs a throwaway stack"))
		}
		if c.issuerSeed == "" {
			errs = append(errs, errors.New("-url needs -issuer-key (LOAD_ISSUER_PRIVATE_KEY)"))
		} else if _, err := issuerKey(c.issuerSeed); err != nil {
			errs = append(errs, err)
		}
	}
	switch {
	case !(c.hop >= 0 && c.hop <= 1): // NaN too
		errs = append(errs, fmt.Errorf("-hop %v: want a chance from 0 to 1", c.hop))
	case c.hop > 0 && c.replicas < 2:
		errs = append(errs, errors.New("-hop above 0 needs more than one relay to hop between: -replicas 2 or more, or several -url"))
	}
	return errors.Join(errs...)
}

// validateCampaign checks what -faults needs: a throwaway stack of several
// relays on Postgres, and nothing else that kills or floods them.
func (c *config) validateCampaign() []error {
	var errs []error
	if len(c.urls) > 0 {
		errs = append(errs, errors.New("-faults needs a throwaway stack: it kills and pauses the relays, Postgres and Redis it started"))
	}
	if c.store != "" && c.store != "postgres" {
		errs = append(errs, errors.New("-faults needs -store postgres: its relays share the store"))
	}
	if c.replicas < 2 {
		errs = append(errs, errors.New("-faults needs -replicas 2 or more: it tests the relays together, through Redis"))
	}
	if len(c.crashes) > 0 {
		errs = append(errs, errors.New("-crash cannot be given with -faults, which kills relays on its own plan"))
	}
	if c.hostile > 0 {
		errs = append(errs, errors.New("-hostile cannot be given with -faults"))
	}
	if c.faultGap <= 0 {
		errs = append(errs, errors.New("-fault-gap must be above 0"))
	}
	if c.duration < 5*time.Second {
		errs = append(errs, errors.New("-faults needs -duration 5s or more: faults begin after the first second and end two seconds before the last send"))
	}
	return errs
}

// validateFailover checks what -failover needs: a throwaway stack on a
// Postgres it owns, and no other fault.
func (c *config) validateFailover() []error {
	if c.failover == "" {
		return nil
	}
	var errs []error
	if c.failover != string(hapg.Sync) && c.failover != string(hapg.Async) {
		errs = append(errs, fmt.Errorf("-failover %q: want sync or async", c.failover))
	}
	if len(c.urls) > 0 {
		errs = append(errs, errors.New("-failover needs a throwaway stack: it starts the Postgres whose primary it kills"))
	}
	switch c.store {
	case "":
		c.store = "postgres"
	case "postgres":
	default:
		errs = append(errs, errors.New("-failover needs -store postgres"))
	}
	if c.faults != nil || len(c.crashes) > 0 {
		errs = append(errs, errors.New("-failover cannot be given with -faults or -crash"))
	}
	if c.failoverAt < 0 || c.failoverAt >= c.duration {
		errs = append(errs, fmt.Errorf("-failover-at %s: must fall inside the offered duration (0 to %s)", c.failoverAt, c.duration))
	}
	if c.failoverAt == 0 {
		c.failoverAt = c.duration / 3
	}
	if c.failover == string(hapg.Async) && c.failoverAt < faults.FailoverCut {
		errs = append(errs, fmt.Errorf("-failover-at %s: async cuts replication %s before the kill, after the first send", c.failoverAt, faults.FailoverCut))
	}
	return errs
}

// checkTargets refuses anything but loopback targets unless -allow-remote:
// this tool must never be pointed at production by accident.
func (c *config) checkTargets(ctx context.Context) error {
	for _, raw := range append(append([]string{}, c.urls...), c.metricsURLs...) {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("target %q: want an http(s) URL", raw)
		}
		if c.allowRemote {
			continue
		}
		if err := loopbackOnly(ctx, u.Hostname()); err != nil {
			return fmt.Errorf("target %q: %w (pass -allow-remote if you mean it)", raw, err)
		}
	}
	return nil
}

func loopbackOnly(ctx context.Context, host string) error {
	if ip := net.ParseIP(host); ip != nil {
		if !ip.IsLoopback() {
			return fmt.Errorf("%s is not a loopback address", host)
		}
		return nil
	}
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", host, err)
	}
	for _, a := range addrs {
		if !a.IP.IsLoopback() {
			return fmt.Errorf("%s resolves to %s, which is not loopback", host, a.IP)
		}
	}
	if len(addrs) == 0 {
		return fmt.Errorf("%s resolves to nothing", host)
	}
	return nil
}

// issuerKey reads a base64 raw Ed25519 seed (32 bytes); a 64-byte private
// key is accepted too, since some tools print that.
func issuerKey(s string) (ed25519.PrivateKey, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		b, err = base64.RawStdEncoding.DecodeString(strings.TrimSpace(s))
	}
	if err != nil {
		return nil, fmt.Errorf("issuer key: not base64: %w", err)
	}
	switch len(b) {
	case ed25519.SeedSize:
		return ed25519.NewKeyFromSeed(b), nil
	case ed25519.PrivateKeySize:
		return ed25519.NewKeyFromSeed(b[:ed25519.SeedSize]), nil
	default:
		return nil, fmt.Errorf("issuer key: %d bytes, want a 32-byte seed", len(b))
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, strings.TrimRight(p, "/"))
		}
	}
	return out
}

// redact hides the values of secret flags in args.
func redact(args []string) []string {
	out := make([]string, 0, len(args))
	hideNext := false
	for _, a := range args {
		if hideNext {
			out = append(out, "<redacted>")
			hideNext = false
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && secret[name] {
			if hasValue {
				out = append(out, a[:strings.Index(a, "=")+1]+"<redacted>")
			} else {
				out = append(out, a)
				hideNext = true
			}
			continue
		}
		out = append(out, a)
	}
	return out
}

// stackOwned are the relay settings the throwaway stack makes itself;
// -relay-env may not change them.
var stackOwned = map[string]bool{
	"FN_LISTEN": true, "FN_DATABASE_URL": true, "FN_ISSUER_KEYS": true, "FN_ISSUER_KEY_FILE": true,
	"FN_RELAY_REPLICAS": true, "FN_REDIS_URL": true, "FN_METRICS_ADDR": true,
}

// relaySetting is the value a throwaway relay runs with for key: the last
// -relay-env for it, or def.
func (c *config) relaySetting(key, def string) string {
	v := def
	for _, kv := range c.relayEnv {
		if k, val, _ := strings.Cut(kv, "="); k == key {
			v = val
		}
	}
	return v
}

// durationList is a repeatable duration flag that also takes a
// comma-separated list.
type durationList []time.Duration

func (l *durationList) String() string {
	if l == nil {
		return ""
	}
	parts := make([]string, len(*l))
	for i, d := range *l {
		parts[i] = d.String()
	}
	return strings.Join(parts, ",")
}

func (l *durationList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		var d seconds
		if err := d.Set(strings.TrimSpace(p)); err != nil {
			return err
		}
		*l = append(*l, time.Duration(d))
	}
	return nil
}

// seedFlag is -faults: a 64-bit seed, and whether one was given at all (0
// is a seed like any other).
type seedFlag struct{ p **uint64 }

func (f seedFlag) String() string {
	if f.p == nil || *f.p == nil {
		return ""
	}
	return strconv.FormatUint(**f.p, 10)
}

func (f seedFlag) Set(v string) error {
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return fmt.Errorf("%q: want a seed from 0 to 2^64-1", v)
	}
	*f.p = &n
	return nil
}

// kindList is -fault-kinds: fault kinds, comma-separated, each once.
type kindList []string

func (l *kindList) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, ",")
}

func (l *kindList) Set(v string) error {
	*l = nil
	for _, k := range strings.Split(v, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(faults.FaultKinds, k) {
			return fmt.Errorf("%q: want fault kinds among %s", k, strings.Join(faults.FaultKinds, ","))
		}
		if !slices.Contains(*l, k) {
			*l = append(*l, k)
		}
	}
	return nil
}

// envList is a repeatable KEY=VALUE flag; one value may hold several
// separated by spaces, as LOAD_RELAY_ENV does.
type envList []string

func (l *envList) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, " ")
}

func (l *envList) Set(v string) error {
	for _, kv := range strings.Fields(v) {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return fmt.Errorf("%q: want KEY=VALUE", kv)
		}
		*l = append(*l, kv)
	}
	return nil
}

// byteSize is a size flag in bytes, with GOMEMLIMIT's suffixes (B, KiB,
// MiB, GiB, TiB).
type byteSize int64

func (b *byteSize) String() string {
	if b == nil || *b == 0 {
		return ""
	}
	return strconv.FormatInt(int64(*b), 10) + "B"
}

func (b *byteSize) Set(v string) error {
	n, err := parseBytes(v)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

func parseBytes(v string) (int64, error) {
	v = strings.TrimSpace(v)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if rest, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult = rest, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q: want a size such as 256MiB, 1GiB or a number of bytes", v)
	}
	return n * mult, nil
}

// seconds is a duration flag that also takes bare seconds ("60"), as the
// original tool's LOAD_DURATION did.
type seconds time.Duration

func (s *seconds) String() string { return time.Duration(*s).String() }

func (s *seconds) Set(v string) error {
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		*s = seconds(time.Duration(n * float64(time.Second)))
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return err
	}
	*s = seconds(d)
	return nil
}
