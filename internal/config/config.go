// Package config owns the relay binary's configuration: the table of every
// setting (its FN_* variable, flag, default, meaning and parser), the binding
// of flags and environment variables, and the database URL. The binary maps
// a Config to the options of the server, the store, push and the wake hub.
package config

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flamenet/relay/internal/edkey"
	"github.com/flamenet/relay/internal/webpush"
)

// Config is everything the relay binary can be told at start. The settings
// table lists each field with its environment variable, flag and default;
// README.md and docs/OPERATIONS.md are generated from it.
type Config struct {
	Listen      string
	DatabaseURL string
	Database    Database // DatabaseURL parsed
	// IssuerKeys are the trusted token issuers' public keys. When none is
	// configured the relay creates (or reuses) IssuerKeyFile and trusts it.
	IssuerKeys    []ed25519.PublicKey
	IssuerKeyFile string
	// IssuerKey is IssuerKeyFile's key once the binary has loaded it (not
	// a setting): with it the relay mints tokens and pairs devices.
	IssuerKey ed25519.PrivateKey
	// VAPIDKeyFile holds the relay's VAPID private key (Web Push),
	// created on the first start with Web Push on (a VAPIDSubject, or an
	// https PublicURL); VAPIDPrivateKey, when set, is the key itself
	// (a fleet's relays share one). VAPIDSubject is the contact the VAPID
	// tokens carry; empty: PublicURL when it is https.
	VAPIDKeyFile    string
	VAPIDPrivateKey string
	VAPIDSubject    string
	// VAPIDPublicKey is the loaded VAPID key's public half (not a
	// setting), served to pages; empty: no Web Push.
	VAPIDPublicKey string

	PollBudgetBytes     int64
	MaxEnvelopeBytes    int
	MaxWait             time.Duration
	MaxRecipients       int
	MaxPendingEnvelopes int64
	MaxPendingBytes     int64
	ShutdownGrace       time.Duration
	StoreTimeout        time.Duration
	LockTimeout         time.Duration
	BodyTimeout         time.Duration
	AckInterval         time.Duration
	SQLiteSynchronous   string
	// An answer has AnswerTimeout, plus its size at AnswerMinRate bytes a
	// second, to be written.
	AnswerTimeout time.Duration
	AnswerMinRate int64
	// Answer bytes being fetched, encoded and written at once: the relay's
	// (0: from the memory target) and one device's (0: twice the largest
	// answer a poll can make).
	AnswerBytesInFlight       int64
	DeviceAnswerBytesInFlight int64

	RelayReplicas        int
	RedisURL             string
	RedisChannelPrefix   string
	RedisConnsPerLoop    int // the publish pool per GOMAXPROCS; see RedisPoolSize
	PostgresConnsPerLoop int
	SendInflight         int
	SendRate             float64
	SendBurst            int
	HouseholdSendRate    float64
	HouseholdSendBurst   int
	DevicePollRate       float64
	DevicePollBurst      int
	MaxHouseholdPending  int64
	MaxHeldPolls         int // 0: derived from the open-file limit
	StreamLife           time.Duration
	EnvelopeTTL          time.Duration
	MetricsAddr          string
	PprofAddr            string
	PushWorkers          int
	PushQueue            int
	PushHouseholdFlight  int
	PushHouseholdQueue   int // 0: a share of PushQueue
	PushHeaderTimeout    time.Duration
	PushAttemptTimeout   time.Duration
	PushTimeout          time.Duration
	PushAllowPrivate     bool
	Console              bool
	APNsKeyFile          string
	APNsKeyID            string
	APNsTeamID           string
	APNsTopic            string
	APNsURL              string
	APNsAlertText        string
	FCMCredentialsFile   string
	FCMURL               string
	FCMTokenURL          string
	// CORSOrigins are the web origins whose pages may call the API; "*"
	// alone allows any. Empty: no CORS headers at all.
	CORSOrigins []string
	LogLevel    string
	LogFormat   string
	AccessLog   bool
	// ParkPolls: held HTTP/1.1 polls give their request's goroutine and
	// buffers up while they wait.
	ParkPolls bool
	// TrustedProxies are the peers whose X-Forwarded-For is believed.
	TrustedProxies []netip.Prefix
	// Pairing (the relay mints tokens with IssuerKeyFile's key): how long
	// an invitation, a minted access token and a renewal secret live, the
	// relay's public base URL (empty: from each request), and pair and
	// renew attempts per minute per client address and in all.
	InviteTTL            time.Duration
	AccessTokenTTL       time.Duration
	RenewalTTL           time.Duration
	PublicURL            string
	PairRatePerAddress   int
	PairRate             int
	issuerKeysConfigured bool
}

// Setting is one configuration knob: its environment variable, the flag
// that overrides it, its default and what it means.
type Setting struct {
	Env     string
	Default string
	Usage   string
	set     func(c *Config, v string) error
}

// Flag returns the command-line flag for the setting: FN_MAX_WAIT_SECS becomes
// -max-wait-secs.
func (s Setting) Flag() string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.Env, "FN_")), "_", "-")
}

var settings = []Setting{
	{"FN_LISTEN", "127.0.0.1:8080", "address the HTTP API listens on", func(c *Config, v string) error {
		if _, _, err := net.SplitHostPort(v); err != nil {
			return err
		}
		c.Listen = v
		return nil
	}},
	{"FN_DATABASE_URL", "sqlite:data/relay.db", "store: sqlite:PATH or postgres://...", func(c *Config, v string) error {
		db, err := ParseDatabaseURL(v)
		c.DatabaseURL, c.Database = v, db
		return err
	}},
	{"FN_ISSUER_KEYS", "", "comma-separated base64 Ed25519 public keys of trusted token issuers; empty: create and trust FN_ISSUER_KEY_FILE", func(c *Config, v string) error {
		keys, err := ParseIssuerKeys(v)
		c.IssuerKeys, c.issuerKeysConfigured = keys, len(keys) > 0
		return err
	}},
	{"FN_ISSUER_KEY_FILE", "data/issuer.key", "issuer private key created and trusted when FN_ISSUER_KEYS is empty", str(func(c *Config) *string { return &c.IssuerKeyFile })},
	{"FN_POLL_BUDGET_BYTES", "2097152", "payload bytes one poll returns at most (at least one envelope)", func(c *Config, v string) error {
		n, err := positive(v, 1<<30)
		c.PollBudgetBytes = n
		return err
	}},
	{"FN_MAX_ENVELOPE_BYTES", "65536", "largest payload of one send, decoded", func(c *Config, v string) error {
		n, err := positive(v, 16<<20)
		c.MaxEnvelopeBytes = int(n)
		return err
	}},
	{"FN_MAX_WAIT_SECS", "60", "longest wait a poll may ask for, in seconds", func(c *Config, v string) error {
		n, err := positive(v, 3600)
		c.MaxWait = time.Duration(n) * time.Second
		return err
	}},
	{"FN_MAX_RECIPIENTS", "64", "most recipients of one send", func(c *Config, v string) error {
		n, err := positive(v, 10000)
		c.MaxRecipients = int(n)
		return err
	}},
	{"FN_MAX_PENDING_ENVELOPES", "10000", "unacknowledged envelopes a device may hold before sends to it get 429 queue_full", func(c *Config, v string) error {
		n, err := positive(v, 1<<40)
		c.MaxPendingEnvelopes = n
		return err
	}},
	{"FN_MAX_PENDING_BYTES", "67108864", "unacknowledged payload bytes a device may hold before sends to it get 429 queue_full", func(c *Config, v string) error {
		n, err := positive(v, 1<<50)
		c.MaxPendingBytes = n
		return err
	}},
	{"FN_SHUTDOWN_GRACE", "10s", "how long a shutdown waits for sends in flight before closing connections", dur(func(c *Config) *time.Duration { return &c.ShutdownGrace })},
	{"FN_STORE_TIMEOUT", "5s", "deadline of one store call; past it the request gets 503 unavailable", dur(func(c *Config) *time.Duration { return &c.StoreTimeout })},
	{"FN_STORE_LOCK_TIMEOUT", "1s", "longest wait of a send for a recipient that another send or a database session holds; past it the send gets 503 unavailable", posDur(func(c *Config) *time.Duration { return &c.LockTimeout })},
	{"FN_BODY_TIMEOUT", "30s", "deadline for a client to send a request body; past it the connection is closed", posDur(func(c *Config) *time.Duration { return &c.BodyTimeout })},
	{"FN_ANSWER_TIMEOUT", "10s", "time an answer has to reach its client, on top of its size at FN_ANSWER_MIN_RATE; past it the connection is cut", posDur(func(c *Config) *time.Duration { return &c.AnswerTimeout })},
	{"FN_ANSWER_MIN_RATE", "65536", "bytes per second a client must read an answer at, at the least (see FN_ANSWER_TIMEOUT)", func(c *Config, v string) error {
		n, err := positive(v, 1<<40)
		c.AnswerMinRate = n
		return err
	}},
	{"FN_ANSWER_BYTES_IN_FLIGHT", "", "answer bytes being read, encoded and written at once; past it a poll with envelopes waiting gets 429 answers_in_flight (empty: a quarter of the memory target, 256 MiB without one)", func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		n, err := positive(v, 1<<50)
		c.AnswerBytesInFlight = n
		return err
	}},
	{"FN_DEVICE_ANSWER_BYTES_IN_FLIGHT", "", "one device's answer bytes in flight; past it the device's next poll with envelopes waiting gets 429 answers_in_flight (empty: twice the largest answer a poll can make)", func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		n, err := positive(v, 1<<50)
		c.DeviceAnswerBytesInFlight = n
		return err
	}},
	{"FN_ACK_INTERVAL", "200ms", "acknowledgements and device activity are written to the store in batches at least this often (a crash may lose the last interval's acks: those envelopes are delivered again)", func(c *Config, v string) error {
		err := dur(func(c *Config) *time.Duration { return &c.AckInterval })(c, v)
		if err == nil && (c.AckInterval <= 0 || c.AckInterval > time.Minute) {
			return errors.New("want a duration above zero and at most 1m")
		}
		return err
	}},
	{"FN_SQLITE_SYNCHRONOUS", "FULL", "SQLite synchronous pragma: FULL or NORMAL (NORMAL may lose the last commits on power loss, never on a crash)", func(c *Config, v string) error {
		switch strings.ToUpper(v) {
		case "FULL", "NORMAL":
			c.SQLiteSynchronous = strings.ToUpper(v)
			return nil
		}
		return errors.New("want FULL or NORMAL")
	}},
	{"FN_RELAY_REPLICAS", "1", "relays sharing the store; above 1, wake-ups go through Redis (needs FN_REDIS_URL and Postgres)", func(c *Config, v string) error {
		n, err := positive(v, 1000)
		c.RelayReplicas = int(n)
		return err
	}},
	{"FN_REDIS_URL", "", "Redis for wake-ups across replicas: redis://host:6379/0, rediss://, ?cluster=true or ?master_name= for Sentinel", str(func(c *Config) *string { return &c.RedisURL })},
	// The database number follows because Redis's pub/sub ignores it
	// (wake/redis); the prefix is for fleets sharing one database.
	{"FN_REDIS_CHANNEL_PREFIX", "fn:wake:", "starts the names of the Redis wake channels, followed by FN_REDIS_URL's database number unless it is 0 (Redis shares channels among its databases); fleets sharing one Redis database need different prefixes, and every relay of a fleet the same", func(c *Config, v string) error {
		if v == "" || len(v) > 100 || strings.ContainsAny(v, "{} \t\r\n") {
			return errors.New("want 1 to 100 characters, without braces (Cluster hash tags) or white space")
		}
		c.RedisChannelPrefix = v
		return nil
	}},
	{"FN_REDIS_MAX_CONNECTIONS_PER_LOOP", "2", "Redis publish pool per GOMAXPROCS; held polls hold no Redis connection (each relay adds one subscriber connection, one per master with a Cluster)", func(c *Config, v string) error {
		n, err := positive(v, 1024)
		c.RedisConnsPerLoop = int(n)
		return err
	}},
	{"FN_PG_MAX_CONNECTIONS_PER_LOOP", "4", "Postgres pool per GOMAXPROCS", func(c *Config, v string) error {
		n, err := positive(v, 10000)
		c.PostgresConnsPerLoop = int(n)
		return err
	}},
	{"FN_MAX_HELD_POLLS", "", "polls held at once; past it a poll gets 503 overloaded (empty: what the open-file limit leaves room for)", func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		n, err := positive(v, 1<<24)
		c.MaxHeldPolls = int(n)
		return err
	}},
	{"FN_ENVELOPE_TTL", "720h", "envelopes older than this are deleted unread", func(c *Config, v string) error {
		err := dur(func(c *Config) *time.Duration { return &c.EnvelopeTTL })(c, v)
		if err == nil && c.EnvelopeTTL < time.Minute {
			return errors.New("want at least 1m")
		}
		return err
	}},
	{"FN_METRICS_ADDR", "", "address of the Prometheus metrics listener, e.g. 127.0.0.1:9090 (empty: off)", func(c *Config, v string) error {
		if v != "" {
			if _, _, err := net.SplitHostPort(v); err != nil {
				return err
			}
		}
		c.MetricsAddr = v
		return nil
	}},
	{"FN_PPROF_ADDR", "", "address of a listener serving Go profiles at /debug/pprof/, e.g. 127.0.0.1:6060 (empty: off); never expose it", func(c *Config, v string) error {
		if v != "" {
			if _, _, err := net.SplitHostPort(v); err != nil {
				return err
			}
		}
		c.PprofAddr = v
		return nil
	}},
	{"FN_SEND_INFLIGHT", "512", "sends processed at once; past it a send gets 429 rate_limited", func(c *Config, v string) error {
		n, err := positive(v, 1<<20)
		c.SendInflight = int(n)
		return err
	}},
	{"FN_SEND_RATE", "5000", "sends per second admitted (token bucket rate)", func(c *Config, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			return errors.New("want a positive number")
		}
		c.SendRate = f
		return nil
	}},
	{"FN_SEND_BURST", "10000", "sends admitted in a burst above the rate (token bucket size)", func(c *Config, v string) error {
		n, err := positive(v, 1<<30)
		c.SendBurst = int(n)
		return err
	}},
	{"FN_HOUSEHOLD_SEND_RATE", "100", "sends per second admitted for one household (its own token bucket, beside the relay's)", func(c *Config, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			return errors.New("want a positive number")
		}
		c.HouseholdSendRate = f
		return nil
	}},
	{"FN_HOUSEHOLD_SEND_BURST", "1000", "sends one household may make in a burst above its rate", func(c *Config, v string) error {
		n, err := positive(v, 1<<30)
		c.HouseholdSendBurst = int(n)
		return err
	}},
	{"FN_DEVICE_POLL_RATE", "10", "polls per second admitted for one device that do not move its cursor (its own token bucket); past it a poll gets 429 rate_limited", func(c *Config, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			return errors.New("want a positive number")
		}
		c.DevicePollRate = f
		return nil
	}},
	{"FN_DEVICE_POLL_BURST", "100", "polls that do not move its cursor one device may make in a burst above its rate", func(c *Config, v string) error {
		n, err := positive(v, 1<<30)
		c.DevicePollBurst = int(n)
		return err
	}},
	{"FN_MAX_HOUSEHOLD_PENDING_BYTES", "536870912", "unacknowledged payload bytes one household's devices may hold in all before sends to it get 429 queue_full", func(c *Config, v string) error {
		n, err := positive(v, 1<<50)
		c.MaxHouseholdPending = n
		return err
	}},
	{"FN_PUSH_WORKERS", "8", "pushes sent at a time", func(c *Config, v string) error {
		n, err := positive(v, 10000)
		c.PushWorkers = int(n)
		return err
	}},
	{"FN_PUSH_QUEUE", "1024", "pushes waiting; past it a push is dropped and counted (the envelope waits for the next poll)", func(c *Config, v string) error {
		n, err := positive(v, 1<<24)
		c.PushQueue = int(n)
		return err
	}},
	{"FN_PUSH_HOUSEHOLD_IN_FLIGHT", "2", "pushes of one household sent at a time, so that one household's hanging endpoints cannot hold every worker", func(c *Config, v string) error {
		n, err := positive(v, 10000)
		c.PushHouseholdFlight = int(n)
		return err
	}},
	{"FN_PUSH_HOUSEHOLD_QUEUE", "", "pushes of one household waiting; past it its pushes are dropped and counted (empty: an eighth of FN_PUSH_QUEUE)", func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		n, err := positive(v, 1<<24)
		c.PushHouseholdQueue = int(n)
		return err
	}},
	{"FN_PUSH_HEADER_TIMEOUT", "5s", "how long a push provider may take to start its answer", posDur(func(c *Config) *time.Duration { return &c.PushHeaderTimeout })},
	{"FN_PUSH_ATTEMPT_TIMEOUT", "10s", "how long one exchange with a push provider may take, its whole answer included", posDur(func(c *Config) *time.Duration { return &c.PushAttemptTimeout })},
	{"FN_PUSH_TIMEOUT", "30s", "how long one push may take, retries included; past it the push is given up and counted failed", posDur(func(c *Config) *time.Duration { return &c.PushTimeout })},
	{"FN_PUSH_ALLOW_PRIVATE", "false", "allow UnifiedPush endpoints on loopback, private and link-local addresses", func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errors.New("want true or false")
		}
		c.PushAllowPrivate = b
		return nil
	}},
	{"FN_VAPID_KEY_FILE", "data/vapid.key", "the relay's VAPID private key for Web Push (base64url P-256 scalar), created (mode 0600) on the first start with Web Push on (FN_VAPID_SUBJECT, or an https FN_PUBLIC_URL) when FN_VAPID_PRIVATE_KEY is empty", str(func(c *Config) *string { return &c.VAPIDKeyFile })},
	{"FN_VAPID_PRIVATE_KEY", "", "the VAPID private key itself (base64url, as web-push tools write it), instead of the file: every relay of a fleet must use the same one", str(func(c *Config) *string { return &c.VAPIDPrivateKey })},
	{"FN_VAPID_SUBJECT", "", "the contact VAPID tokens give push services: mailto:you@example.com or an https:// URL; empty: FN_PUBLIC_URL when it is https, else no webpush kind", func(c *Config, v string) error {
		c.VAPIDSubject = v
		if v == "" {
			return nil
		}
		return webpush.CheckSubject(v)
	}},
	{"FN_APNS_KEY_FILE", "", "APNs token-auth key (.p8); empty: no APNs pushes", str(func(c *Config) *string { return &c.APNsKeyFile })},
	{"FN_APNS_KEY_ID", "", "APNs key id", str(func(c *Config) *string { return &c.APNsKeyID })},
	{"FN_APNS_TEAM_ID", "", "Apple developer team id", str(func(c *Config) *string { return &c.APNsTeamID })},
	{"FN_APNS_TOPIC", "", "the app's bundle id (apns-topic)", str(func(c *Config) *string { return &c.APNsTopic })},
	{"FN_APNS_ALERT_TEXT", "New message", "the text of APNs alert pushes, shown only when the app's Notification Service Extension cannot replace it", str(func(c *Config) *string { return &c.APNsAlertText })},
	{"FN_APNS_URL", "https://api.push.apple.com", "APNs base URL (https://api.sandbox.push.apple.com for development builds)", str(func(c *Config) *string { return &c.APNsURL })},
	{"FN_FCM_CREDENTIALS_FILE", "", "FCM service-account JSON file; empty: no FCM pushes", str(func(c *Config) *string { return &c.FCMCredentialsFile })},
	{"FN_FCM_URL", "https://fcm.googleapis.com", "FCM HTTP v1 base URL", str(func(c *Config) *string { return &c.FCMURL })},
	{"FN_FCM_TOKEN_URL", "", "OAuth token URL; empty: the credentials file's token_uri", str(func(c *Config) *string { return &c.FCMTokenURL })},
	{"FN_CORS_ORIGINS", "", "comma-separated web origins (https://app.example) whose pages may call the API from a browser, or * for any (tokens are bearer headers, never cookies); empty: no CORS headers", func(c *Config, v string) error {
		o, err := ParseCORSOrigins(v)
		c.CORSOrigins = o
		return err
	}},
	{"FN_CONSOLE", "false", "serve the household console at /console/, where an admin device pairs the browser, lists, removes and invites devices; needs pairing (FN_ISSUER_KEYS empty)", func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errors.New("want true or false")
		}
		c.Console = b
		return nil
	}},
	{"FN_LOG_LEVEL", "info", "debug, info, warn or error", func(c *Config, v string) error {
		switch v {
		case "debug", "info", "warn", "error":
			c.LogLevel = v
			return nil
		}
		return errors.New("want debug, info, warn or error")
	}},
	{"FN_LOG_FORMAT", "text", "text or json", func(c *Config, v string) error {
		if v != "text" && v != "json" {
			return errors.New("want text or json")
		}
		c.LogFormat = v
		return nil
	}},
	{"FN_ACCESS_LOG", "on", "one info line per finished request (on or off); refusals anyone can provoke are capped per second", func(c *Config, v string) error {
		return onOff(v, &c.AccessLog)
	}},
	{"FN_STREAM_LIFE", "10m", "longest a stream (GET /v1/stream) stays open, less up to a tenth, and never past its token's expiry; then its client reconnects (1m to 24h)", durIn(time.Minute, 24*time.Hour, func(c *Config) *time.Duration { return &c.StreamLife })},
	{"FN_PARK_POLLS", "on", "held HTTP/1.1 polls give their goroutine and buffers up while they wait (on or off): less memory per held poll, more CPU per answer", func(c *Config, v string) error {
		return onOff(v, &c.ParkPolls)
	}},
	{"FN_TRUSTED_PROXIES", "", "comma-separated CIDRs (or addresses) of reverse proxies whose X-Forwarded-For names the client in the access log; empty: none", func(c *Config, v string) error {
		ps, err := ParseTrustedProxies(v)
		c.TrustedProxies = ps
		return err
	}},
	{"FN_INVITE_TTL", "10m", "lifetime of a pairing invitation (1m to 24h); pairing is on only when the relay mints its own tokens (FN_ISSUER_KEYS empty)", durIn(time.Minute, 24*time.Hour, func(c *Config) *time.Duration { return &c.InviteTTL })},
	{"FN_ACCESS_TOKEN_TTL", "1h", "lifetime of the access tokens that pairing and renewal mint (1m to 24h)", durIn(time.Minute, 24*time.Hour, func(c *Config) *time.Duration { return &c.AccessTokenTTL })},
	{"FN_RENEWAL_TTL", "2160h", "lifetime of a renewal secret; each renewal issues a new one with a fresh lifetime (1h to 8760h)", durIn(time.Hour, 8760*time.Hour, func(c *Config) *time.Duration { return &c.RenewalTTL })},
	{"FN_PUBLIC_URL", "", "the relay's public base URL, such as https://relay.example, in invitation links; empty: from each request (Host, and TLS or X-Forwarded-Proto from FN_TRUSTED_PROXIES)", func(c *Config, v string) error {
		if v == "" {
			c.PublicURL = ""
			return nil
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return errors.New("want an http or https URL such as https://relay.example, without credentials, query or fragment")
		}
		c.PublicURL = strings.TrimSuffix(v, "/")
		return nil
	}},
	{"FN_PAIR_RATE_PER_ADDRESS", "10", "pair and renew attempts per minute from one client address (also the burst); past it 429 rate_limited", func(c *Config, v string) error {
		n, err := positive(v, 1_000_000)
		c.PairRatePerAddress = int(n)
		return err
	}},
	{"FN_PAIR_RATE", "100", "pair and renew attempts per minute from all clients together (also the burst); past it 429 rate_limited", func(c *Config, v string) error {
		n, err := positive(v, 1_000_000)
		c.PairRate = int(n)
		return err
	}},
}

// ParseTrustedProxies reads comma-separated CIDRs; a bare address is a
// prefix of its full length.
func ParseTrustedProxies(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for part := range strings.SplitSeq(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		p, err := netip.ParsePrefix(part)
		if err != nil {
			a, aerr := netip.ParseAddr(part)
			if aerr != nil || a.Zone() != "" {
				return nil, fmt.Errorf("%q: want a CIDR such as 10.0.0.0/8 or an address", part)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		if p.Addr().Is4In6() {
			// ::ffff:10.0.0.0/104 means 10.0.0.0/8: peers are compared unmapped.
			if p.Bits() < 96 {
				return nil, fmt.Errorf("%q: an IPv4-mapped prefix shorter than /96", part)
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// ParseCORSOrigins reads "*" alone, or comma-separated origins spelt as a
// browser sends them in its Origin header: scheme://host[:port], lower
// case, no path, no default port. Anything else would never match, so it
// is refused at start.
func ParseCORSOrigins(v string) ([]string, error) {
	var list []string
	any := false
	for part := range strings.SplitSeq(v, ",") {
		part = strings.TrimSpace(part)
		switch {
		case part == "":
			continue
		case part == "*":
			any = true
			continue
		}
		if err := checkOrigin(part); err != nil {
			return nil, fmt.Errorf("%q: %w", part, err)
		}
		if !slices.Contains(list, part) {
			list = append(list, part)
		}
	}
	switch {
	case any && len(list) > 0:
		return nil, errors.New(`"*" allows every origin; list no others beside it`)
	case any:
		return []string{"*"}, nil
	}
	return list, nil
}

func checkOrigin(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return errors.New("not an origin (scheme://host[:port])")
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("want an http or https origin")
	case u.Host == "" || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(s, "?") || strings.HasSuffix(s, "#"):
		return errors.New("an origin is scheme://host[:port], without path, query or trailing slash")
	case s != strings.ToLower(s):
		return errors.New("browsers send origins in lower case")
	case (u.Scheme == "http" && u.Port() == "80") || (u.Scheme == "https" && u.Port() == "443"):
		return errors.New("browsers leave the default port out of an origin")
	}
	return nil
}

func str(field func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *field(c) = v; return nil }
}

// dur accepts a Go duration ("10s", "1m30s") or whole seconds ("10").
func dur(field func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			*field(c) = time.Duration(n) * time.Second
			return nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return errors.New("want a duration such as 10s or 1m")
		}
		*field(c) = d
		return nil
	}
}

// durIn is dur within [lo, hi].
func durIn(lo, hi time.Duration, field func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		if err := dur(field)(c, v); err != nil {
			return err
		}
		if d := *field(c); d < lo || d > hi {
			return fmt.Errorf("want a duration from %v to %v", lo, hi)
		}
		return nil
	}
}

// posDur is dur that refuses zero.
func posDur(field func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		if err := dur(field)(c, v); err != nil {
			return err
		}
		if *field(c) <= 0 {
			return errors.New("want a duration above zero")
		}
		return nil
	}
}

func positive(v string, limit int64) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 || n > limit {
		return 0, fmt.Errorf("want a whole number from 1 to %d", limit)
	}
	return n, nil
}

// ParseIssuerKeys reads comma-separated standard base64 Ed25519 public keys
// and refuses any that is not a canonical, non-small-order point: such a key
// would let anyone forge tokens.
func ParseIssuerKeys(v string) ([]ed25519.PublicKey, error) {
	var keys []ed25519.PublicKey
	for i, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(part)
		if err != nil {
			return nil, fmt.Errorf("key %d: not standard base64", i+1)
		}
		if err := edkey.Check(b); err != nil {
			return nil, fmt.Errorf("key %d: %w", i+1, err)
		}
		keys = append(keys, ed25519.PublicKey(b))
	}
	return keys, nil
}

func (c Config) validate() error {
	if c.RelayReplicas > 1 {
		switch {
		case c.RedisURL == "":
			return errors.New("FN_REDIS_URL: required when FN_RELAY_REPLICAS is above 1")
		case c.Database.Kind == SQLite:
			return errors.New("FN_DATABASE_URL: several replicas need Postgres; SQLite is for one relay")
		case !c.issuerKeysConfigured:
			return errors.New("FN_ISSUER_KEYS: required when FN_RELAY_REPLICAS is above 1, so that every replica trusts the same issuer")
		}
	}
	if c.Console && c.issuerKeysConfigured {
		return errors.New("FN_CONSOLE: the console pairs devices, which the relay does only when it mints its own tokens; leave FN_ISSUER_KEYS empty")
	}
	if c.ShutdownGrace <= 0 {
		return errors.New("FN_SHUTDOWN_GRACE: must be above zero")
	}
	if c.StoreTimeout <= 0 {
		return errors.New("FN_STORE_TIMEOUT: must be above zero")
	}
	return nil
}

// A "loop" in the per-loop pool settings is one scheduler thread: a pool of
// N per loop is N x GOMAXPROCS connections.

// RedisPoolSize returns the Redis command pool of this process, which
// publishes wake-ups after commits. A held poll holds no Redis connection.
func (c Config) RedisPoolSize() int {
	return c.RedisConnsPerLoop * runtime.GOMAXPROCS(0)
}

// PostgresPoolSize returns the Postgres pool of this process.
func (c Config) PostgresPoolSize() int {
	return c.PostgresConnsPerLoop * runtime.GOMAXPROCS(0)
}

// Table returns the Markdown table of every setting, as README.md and
// docs/OPERATIONS.md show it. A test keeps those files equal to it.
func Table() string {
	var b strings.Builder
	b.WriteString("| Variable | Flag | Default | Meaning |\n|---|---|---|---|\n")
	for _, s := range settings {
		def := "`" + s.Default + "`"
		if s.Default == "" {
			def = "(empty)"
		}
		fmt.Fprintf(&b, "| `%s` | `-%s` | %s | %s |\n", s.Env, s.Flag(), def, s.Usage)
	}
	return b.String()
}

// onOff sets *dst from "on" or "off".
func onOff(v string, dst *bool) error {
	switch v {
	case "on", "off":
		*dst = v == "on"
		return nil
	}
	return errors.New("want on or off")
}
