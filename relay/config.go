package relay

import (
	"crypto/ed25519"
	"net/netip"
	"time"
)

// Config is what the server serves with: its limits, deadlines and
// admission. The binary's whole configuration (the FN_* settings) is the
// config package's; the binary maps it here.
type Config struct {
	// IssuerKeys are the trusted token issuers' public keys; at least one.
	IssuerKeys []ed25519.PublicKey
	// IssuerKey, when set, is the private key of one of IssuerKeys: the
	// relay then pairs devices and mints their tokens (package pairing). nil:
	// tokens come from elsewhere and the pairing endpoints are 404.
	IssuerKey ed25519.PrivateKey
	// InviteTTL, AccessTokenTTL and RenewalTTL are the lifetimes of an
	// invitation, a minted access token and a renewal secret.
	InviteTTL      time.Duration
	AccessTokenTTL time.Duration
	RenewalTTL     time.Duration
	// PublicURL is the base of invitation links; empty: from the request.
	PublicURL string
	// VAPIDPublicKey is the relay's VAPID public key (base64url), served
	// for pages' applicationServerKey; empty: no webpush kind.
	VAPIDPublicKey string
	// PairRatePerAddress and PairRate are pair and renew attempts a
	// minute (and the burst), from one client address and in all.
	PairRatePerAddress int
	PairRate           int

	PollBudgetBytes     int64
	MaxEnvelopeBytes    int
	MaxWait             time.Duration
	MaxRecipients       int
	MaxPendingEnvelopes int64
	MaxPendingBytes     int64
	StoreTimeout        time.Duration
	LockTimeout         time.Duration
	BodyTimeout         time.Duration
	AckInterval         time.Duration
	// EnvelopeTTL is how long an envelope waits unread before expiry
	// deletes it.
	EnvelopeTTL time.Duration
	// An answer has AnswerTimeout, plus its size at AnswerMinRate bytes a
	// second, to be written; then its connection is cut (answers.go).
	AnswerTimeout time.Duration
	AnswerMinRate int64
	// AnswerBytesInFlight bounds the bytes of poll answers being fetched,
	// encoded and written at once (0: a quarter of the memory target);
	// DeviceAnswerBytesInFlight one device's (0: twice the largest answer).
	AnswerBytesInFlight       int64
	DeviceAnswerBytesInFlight int64

	// RelayReplicas above 1: the relays share the store and wake each
	// other through the hub, which the server then watches.
	RelayReplicas      int
	SendInflight       int
	SendRate           float64
	SendBurst          int
	HouseholdSendRate  float64
	HouseholdSendBurst int
	// DevicePollRate and DevicePollBurst are one device's poll bucket.
	DevicePollRate      float64
	DevicePollBurst     int
	MaxHouseholdPending int64
	MaxHeldPolls        int // 0: no cap
	// StreamLife bounds a stream's life (0: DefaultStreamLife).
	StreamLife time.Duration

	// AccessLog: one line per finished request (record.go, internal/accesslog).
	AccessLog bool
	// ParkPolls: held HTTP/1.1 polls park (see park.go).
	ParkPolls bool
	// TrustedProxies are the peers whose X-Forwarded-For is believed.
	TrustedProxies []netip.Prefix
	// CORSOrigins are the web origins whose pages may call the API; "*"
	// alone allows any. Empty: no CORS headers at all.
	CORSOrigins []string
	// Console serves the household console at /console/ (package
	// console); it needs pairing (IssuerKey).
	Console bool
}
