// Package hostile is the load no client should send, beside the ordinary
// one: malformed and oversized bodies, bad tokens, requests that never
// finish, floods of guesses at pairing, clients that never read, each
// judged by how the relays answer and whether they close in time; and the
// renewers, honest devices renewing throughout, whose every renewal must
// succeed however hard pairing is flooded.
package hostile

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/flamenet/relay/client"
	relayconfig "github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/loadtest/report"
	"github.com/flamenet/relay/token"
)

// Hostile floods the relays beside the ordinary load: -hostile N
// connections, each with a household of its own, loop over the kinds
// -hostile-kinds names (hostileKindSets) for the offered duration (and
// until every kind has been sent once). What fails the run: a 5xx other
// than 503, a hostile request accepted, or a connection the relay does not
// close within closeLimit.
type Hostile struct {
	windows Windows
	targets []string // host:port of each relay
	key     ed25519.PrivateKey
	forger  ed25519.PrivateKey // a key no relay trusts
	tag     string
	n       int
	kinds   []hostileKind
	// closeLimit is how long the relay has to close a connection whose
	// request never finishes: its body timeout, plus slack for load.
	closeLimit time.Duration
	// The relay's household bucket, to tell a burst the bucket should have
	// refused from one it rightly let through.
	householdRate  float64
	householdBurst float64
	// burstFor bounds one household burst.
	burstFor time.Duration
	// slow is the slow readers (slowread.go); nil without them.
	slow *slowReaders

	mu       sync.Mutex
	requests int
	outcomes map[string]map[string]int
	failures map[string]int
	tried    map[string]bool
}

// hostileSlack is added to the relay's body timeout for closeLimit.
const hostileSlack = 10 * time.Second

// Config is what the hostile connections are made of.
type Config struct {
	Connections int    // hostile connections, each a household of its own
	SlowReaders int    // slow readers a round; 0: none
	Kinds       string // "all" or "pairing" ([KindNames]); "": all
	// Relay is the relays' configuration, whose limits are judged.
	Relay   relayconfig.Config
	Targets []string           // the relays' base URLs
	Key     ed25519.PrivateKey // the issuer the relays trust
	Tag     string             // the run's, for names of its own
}

// Windows tell whether a relay was down for a fault the tester caused
// while a request to it ran and failed with err.
type Windows interface {
	InCrashWindow(relay int, from, to time.Time, err error) bool
}

// New returns the hostile connections of cfg; a request that finds a relay
// down in one of windows is put down to that.
func New(cfg Config, windows Windows) *Hostile {
	h := &Hostile{
		windows:        windows,
		key:            cfg.Key,
		tag:            cfg.Tag,
		n:              cfg.Connections,
		closeLimit:     cfg.Relay.BodyTimeout + hostileSlack,
		householdRate:  cfg.Relay.HouseholdSendRate,
		householdBurst: float64(cfg.Relay.HouseholdSendBurst),
		burstFor:       10 * time.Second,
		outcomes:       map[string]map[string]int{},
		failures:       map[string]int{},
		tried:          map[string]bool{},
	}
	h.kinds = hostileKinds // a config made in code, without -hostile-kinds
	if cfg.Kinds != "" {
		h.kinds = hostileKindSets[cfg.Kinds]
	}
	for _, t := range cfg.Targets {
		u, _ := url.Parse(t)
		h.targets = append(h.targets, u.Host)
	}
	_, h.forger, _ = ed25519.GenerateKey(rand.Reader)
	if cfg.SlowReaders > 0 {
		h.slow = newSlowReaders(h, cfg)
	}
	return h
}

// StopAt returns when the hostile requests still under way after the offered
// duration (ending at end) are given up: once the relay has had its limit
// to close or refuse each, the slow readers' included, whose polls may go
// out late. It moves while the slow readers fill their device.
func (h *Hostile) StopAt(end time.Time) time.Time {
	at := end.Add(h.closeLimit)
	if h.slow != nil {
		at = later(at, h.slow.due())
	}
	return at.Add(time.Second)
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// The hostile connections write their requests by hand (rawhttp.go), so
// they keep the wire shapes of the bodies they write and the errors they
// read; answers they decode whole are the client package's.
type sendRequest struct {
	ID      string   `json:"id" msgpack:"id"`
	To      []string `json:"to" msgpack:"to"`
	Payload []byte   `json:"payload" msgpack:"payload"`
}

type ackRequest struct {
	Cursor int64 `json:"cursor" msgpack:"cursor"`
}

type errorBody struct {
	Error   string `json:"error" msgpack:"error"`
	Message string `json:"message" msgpack:"message"`
	Head    int64  `json:"head" msgpack:"head"`
	Limit   string `json:"limit" msgpack:"limit"`
}

// hostileKind is one sort of hostile request.
type hostileKind struct {
	name string
	run  func(ctx context.Context, w *hworker, kind string)
}

// Unsent bodies: the request declares one and never sends it, on paths
// that answer without reading it. The relay must answer (or refuse) and
// close at once.
var unsentTargets = []struct {
	name, method, path string
	auth, refuse       bool
}{
	{"GET /live", http.MethodGet, "/live", false, false},
	{"GET /ready", http.MethodGet, "/ready", false, false},
	{"POST /nowhere", http.MethodPost, "/nowhere", false, true},
	{"POST /v1/send without token", http.MethodPost, "/v1/send", false, true},
}

var hostileKinds = func() []hostileKind {
	ks := []hostileKind{
		{"msgpack send, payload declared bin32 4 GiB", func(ctx context.Context, w *hworker, kind string) {
			w.quick(ctx, kind, rawRequest(http.MethodPost, "/v1/send", w.mpHeaders(), bin32Send()), true)
		}},
		{"msgpack register, identity_key declared bin32 4 GiB", func(ctx context.Context, w *hworker, kind string) {
			w.quick(ctx, kind, rawRequest(http.MethodPost, "/v1/register", w.mpHeaders(), bin32Register()), true)
		}},
		{"msgpack send, 95,000 nested arrays", func(ctx context.Context, w *hworker, kind string) {
			w.quick(ctx, kind, rawRequest(http.MethodPost, "/v1/send", w.mpHeaders(), nestedArrays(95000)), true)
		}},
		{"msgpack send, trailing bytes", func(ctx context.Context, w *hworker, kind string) {
			b, _ := msgpack.Marshal(sendRequest{ID: w.nextID("t"), To: []string{hostileDevice}, Payload: []byte("x")})
			w.quick(ctx, kind, rawRequest(http.MethodPost, "/v1/send", w.mpHeaders(), append(b, 0xc0)), true)
		}},
		{"json send, trailing bytes", func(ctx context.Context, w *hworker, kind string) {
			b, _ := json.Marshal(sendRequest{ID: w.nextID("t"), To: []string{hostileDevice}, Payload: []byte("x")})
			w.quick(ctx, kind, rawRequest(http.MethodPost, "/v1/send", w.jsonHeaders(), append(b, []byte(` {"id":"x"}`)...)), true)
		}},
	}
	for _, framing := range []string{"content-length", "chunked"} {
		for _, t := range unsentTargets {
			declare := "Content-Length: 1000"
			if framing == "chunked" {
				declare = "Transfer-Encoding: chunked"
			}
			ks = append(ks, hostileKind{"unsent body (" + framing + "), " + t.name, func(ctx context.Context, w *hworker, kind string) {
				w.stall(ctx, kind, rawRequest(t.method, t.path, []string{declare}, nil), t.refuse)
			}})
		}
		ks = append(ks, hostileKind{"send body stalls halfway (" + framing + ")", func(ctx context.Context, w *hworker, kind string) {
			b, _ := json.Marshal(sendRequest{ID: w.nextID("s"), To: []string{hostileDevice}, Payload: bytes.Repeat([]byte("x"), 4096)})
			var req []byte
			if framing == "chunked" {
				req = rawRequest(http.MethodPost, "/v1/send", append(w.jsonHeaders(), "Transfer-Encoding: chunked"), nil)
				req = append(req, fmt.Sprintf("%x\r\n", len(b))...)
			} else {
				req = rawRequest(http.MethodPost, "/v1/send", append(w.jsonHeaders(), "Content-Length: "+strconv.Itoa(len(b))), nil)
			}
			w.stall(ctx, kind, append(req, b[:len(b)/2]...), true)
		}})
	}
	for _, t := range []struct {
		name string
		tok  func(w *hworker) string
	}{
		{"token malformed", func(w *hworker) string { return malformedTokens[w.next()%len(malformedTokens)](w.valid) }},
		{"token expired", func(w *hworker) string { return w.expired }},
		{"token alg none", func(w *hworker) string { return w.algNone }},
		{"token HS256", func(w *hworker) string { return w.hs256 }},
		{"token forged", func(w *hworker) string { return w.forged }},
		{"no token", func(*hworker) string { return "" }},
	} {
		ks = append(ks, hostileKind{t.name, func(ctx context.Context, w *hworker, kind string) {
			var hdr []string
			if tok := t.tok(w); tok != "" {
				hdr = append(hdr, "Authorization: Bearer "+tok)
			}
			w.quick(ctx, kind, rawRequest(http.MethodGet, "/v1/poll?wait=0", hdr, nil), true)
		}})
	}
	ks = append(ks, pairingKinds...)
	ks = append(ks,
		hostileKind{"household burst", func(ctx context.Context, w *hworker, kind string) { w.burst(ctx, kind) }},
		hostileKind{"ready flood", func(ctx context.Context, w *hworker, kind string) {
			for range 20 {
				if ctx.Err() != nil {
					return
				}
				w.quick(ctx, kind, rawRequest(http.MethodGet, "/ready", nil, nil), false)
			}
		}},
	)
	return ks
}()

// hostileKindSets are -hostile-kinds' choices: every kind, or only those
// against the pairing endpoints, to see what they alone cost the load.
var hostileKindSets = map[string][]hostileKind{
	"all":     hostileKinds,
	"pairing": pairingKinds,
}

// KindNames returns the names of the kinds of request of set ("all" or
// "pairing"), as the report counts them; nil for another set.
func KindNames(set string) []string {
	var out []string
	for _, k := range hostileKindSets[set] {
		out = append(out, k.name)
	}
	return out
}

// malformedTokens spoil a valid token in ways a parser must survive.
var malformedTokens = []func(valid string) string{
	func(string) string { return "not-a-token" },
	func(string) string { return "a.b" },
	func(v string) string { return v + "=" },                             // padding: not the one spelling
	func(v string) string { return strings.Repeat("A", 5000) + "." + v }, // over the length limit
	func(v string) string { return strings.Replace(v, ".", ".!", 1) },    // not base64url
}

// hostileDevice is each hostile household's one device.
const hostileDevice = "h"

// bin32Send is a 28-byte MessagePack send whose payload declares 4 GiB.
func bin32Send() []byte {
	b := []byte{0x83, 0xa2, 'i', 'd', 0xa4, 'x', 'y', 'z', 'w', 0xa2, 't', 'o', 0x91, 0xa1, 'h', 0xa7}
	b = append(b, "payload"...)
	return append(b, 0xc6, 0xff, 0xff, 0xff, 0xff)
}

// bin32Register is a register body whose identity_key declares 4 GiB.
func bin32Register() []byte {
	b := append([]byte{0x81, 0xac}, "identity_key"...)
	return append(b, 0xc6, 0xff, 0xff, 0xff, 0xff)
}

// nestedArrays is n one-element arrays, each inside the last, around nil.
func nestedArrays(n int) []byte {
	return append(bytes.Repeat([]byte{0x91}, n), 0xc0)
}

// Run starts the connections and returns when they have stopped: after
// end once every kind was sent, or when ctx ends.
func (h *Hostile) Run(ctx context.Context, end time.Time) {
	var wg sync.WaitGroup
	for i := range h.n {
		wg.Go(func() { h.worker(ctx, i, end) })
	}
	if h.slow != nil {
		wg.Go(func() { h.slow.run(ctx, end) })
	}
	wg.Wait()
}

// hworker is one hostile connection and its household.
type hworker struct {
	h      *Hostile
	i      int
	relay  int // the index of target among the relays
	target string
	local  net.Addr
	conn   *rawConn // kept alive between quick requests
	n      atomic.Int64

	household                              string
	valid, forged, expired, algNone, hs256 string
}

func (h *Hostile) worker(ctx context.Context, i int, end time.Time) {
	w := &hworker{h: h, i: i, relay: i % len(h.targets), target: h.targets[i%len(h.targets)],
		household: "hostile-" + h.tag + "-" + strconv.Itoa(i)}
	if host, _, err := net.SplitHostPort(w.target); err == nil && host == "127.0.0.1" {
		// Source addresses of their own, so that these connections' ports
		// never crowd the pairs' out.
		w.local = &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(128+i%64))}
	}
	w.mintTokens()
	defer w.closeConn()

	// The household's device exists, as an abusive but registered client's
	// would: sends to it pass validation and reach the limits.
	w.quick(ctx, "register (own household)", rawRequest(http.MethodPost, "/v1/register", w.jsonHeaders(), []byte("{}")), false)

	order := make([]int, len(h.kinds))
	for k := range order {
		// Each connection starts at another kind, so that every kind is
		// under way early in the run.
		order[k] = (k + i) % len(order)
	}
	for round := 0; ; round++ {
		if round > 0 {
			mrand.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		}
		for _, k := range order {
			if ctx.Err() != nil || (time.Now().After(end) && h.allTried()) {
				return
			}
			kind := h.kinds[k]
			kind.run(ctx, w, kind.name)
			h.mu.Lock()
			h.tried[kind.name] = true
			h.mu.Unlock()
		}
	}
}

func (h *Hostile) allTried() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.tried) == len(h.kinds)
}

func (w *hworker) next() int { return int(w.n.Add(1)) }

func (w *hworker) nextID(prefix string) string {
	return "h" + prefix + "-" + w.h.tag + "-" + strconv.Itoa(w.i) + "-" + strconv.Itoa(w.next())
}

func (w *hworker) mintTokens() {
	now := time.Now()
	c := token.Claims{Household: w.household, Device: hostileDevice, Expires: now.Add(3 * time.Hour), IssuedAt: now, Scope: token.ScopeDevice}
	w.valid, _ = token.Mint(w.h.key, c)
	w.forged, _ = token.Mint(w.h.forger, c)
	old := c
	old.Expires, old.IssuedAt = now.Add(-time.Hour), now.Add(-2*time.Hour)
	w.expired, _ = token.Mint(w.h.key, old)

	b64 := base64.RawURLEncoding
	claims, _ := json.Marshal(map[string]any{"hh": w.household, "sub": hostileDevice, "exp": c.Expires.Unix(), "iat": now.Unix()})
	w.algNone = b64.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + b64.EncodeToString(claims) + "."
	// The classic confusion: HMAC keyed with the issuer's public key,
	// which anyone may know.
	signing := b64.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + b64.EncodeToString(claims)
	mac := hmac.New(sha256.New, w.h.key.Public().(ed25519.PublicKey))
	mac.Write([]byte(signing))
	w.hs256 = signing + "." + b64.EncodeToString(mac.Sum(nil))
}

// auth is the Authorization header of a hostile body: mostly the
// household's own token, now and then none or a forged one.
func (w *hworker) auth() string {
	switch w.next() % 5 {
	case 3:
		return ""
	case 4:
		return "Authorization: Bearer " + w.forged
	}
	return "Authorization: Bearer " + w.valid
}

func (w *hworker) mpHeaders() []string {
	return []string{w.auth(), "Content-Type: application/msgpack", "Accept: application/msgpack"}
}

func (w *hworker) jsonHeaders() []string {
	return []string{"Authorization: Bearer " + w.valid, "Content-Type: application/json"}
}

func (w *hworker) closeConn() {
	if w.conn != nil {
		w.conn.close()
		w.conn = nil
	}
}

// quick sends a complete request on the connection kept alive, and reads
// the answer. When the relay says it will close the connection, it must.
func (w *hworker) quick(ctx context.Context, kind string, req []byte, refuse bool) (*http.Response, []byte) {
	return w.quickJudged(ctx, kind, req, refuse, nil)
}

// quickJudged is quick with a judge of its own, which names what else in
// an answer fails the run.
func (w *hworker) quickJudged(ctx context.Context, kind string, req []byte, refuse bool, judge func(*http.Response, []byte) string) (*http.Response, []byte) {
	for attempt := 0; ; attempt++ {
		reused := w.conn != nil
		from := time.Now()
		if w.conn == nil {
			c, err := dialRaw(ctx, w.target, w.local)
			if err != nil {
				w.h.transport(ctx, kind, w.relay, from, err)
				return nil, nil
			}
			w.conn = c
		}
		w.h.count()
		resp, body, err := w.conn.roundTrip(req, from.Add(w.h.closeLimit))
		if err != nil {
			w.closeConn()
			if reused && attempt == 0 && !isTimeout(err) && ctx.Err() == nil {
				continue // the relay had closed the idle connection
			}
			w.h.transport(ctx, kind, w.relay, from, err)
			return nil, nil
		}
		outcome, fail := answerOutcome(resp, body, refuse)
		if judge != nil {
			if more := judge(resp, body); more != "" {
				fail = joinMsg(fail, more)
			}
		}
		if resp.Close {
			closed := w.conn.awaitClose(time.Now().Add(w.h.closeLimit))
			w.closeConn()
			if closed {
				outcome += " +closed"
			} else {
				fail = joinMsg(fail, "connection not closed after Connection: close")
			}
		}
		w.h.note(ctx, kind, outcome, fail)
		return resp, body
	}
}

// stall writes a request that never finishes on a fresh connection: the
// relay must answer or refuse it, and close the connection, within
// closeLimit.
func (w *hworker) stall(ctx context.Context, kind string, req []byte, refuse bool) {
	from := time.Now()
	c, err := dialRaw(ctx, w.target, w.local)
	if err != nil {
		w.h.transport(ctx, kind, w.relay, from, err)
		return
	}
	defer c.close()
	w.h.count()
	deadline := from.Add(w.h.closeLimit)
	if err := c.write(req, deadline); err != nil {
		w.h.transport(ctx, kind, w.relay, from, err)
		return
	}
	resp, body, err := c.readResponse(deadline)
	if err != nil {
		if isTimeout(err) {
			w.h.note(ctx, kind, "no answer", fmt.Sprintf("connection not closed within %s", w.h.closeLimit))
			return
		}
		w.h.note(ctx, kind, "no answer +closed", "")
		return
	}
	outcome, fail := answerOutcome(resp, body, refuse)
	if c.awaitClose(deadline) {
		outcome += " +closed"
	} else {
		fail = joinMsg(fail, fmt.Sprintf("connection not closed within %s", w.h.closeLimit))
	}
	w.h.note(ctx, kind, outcome, fail)
}

// burst sends from the household as fast as four connections go, until its
// bucket refuses (429 with limit household_send_rate) or burstFor passes,
// then acknowledges what it stored. Accepting more than the bucket holds
// fails the run.
func (w *hworker) burst(ctx context.Context, kind string) {
	const conns = 4
	start := time.Now()
	stopAt := start.Add(w.h.burstFor)
	var refused atomic.Bool
	var accepted, maxSeq atomic.Int64
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			c, err := dialRaw(ctx, w.target, w.local)
			if err != nil {
				w.h.transport(ctx, kind, w.relay, time.Now(), err)
				return
			}
			defer c.close()
			for !refused.Load() && ctx.Err() == nil && time.Now().Before(stopAt) {
				b, _ := json.Marshal(sendRequest{ID: w.nextID("b"), To: []string{hostileDevice}, Payload: []byte("x")})
				from := time.Now()
				w.h.count()
				resp, body, err := c.roundTrip(rawRequest(http.MethodPost, "/v1/send", w.jsonHeaders(), b), from.Add(w.h.closeLimit))
				if err != nil {
					w.h.transport(ctx, kind, w.relay, from, err)
					return
				}
				outcome, fail := answerOutcome(resp, body, false)
				w.h.note(ctx, kind, outcome, fail)
				switch {
				case resp.StatusCode == http.StatusAccepted:
					accepted.Add(1)
					var sr client.SendResult
					if json.Unmarshal(body, &sr) == nil {
						for _, d := range sr.Deliveries {
							for old := maxSeq.Load(); d.Seq > old && !maxSeq.CompareAndSwap(old, d.Seq); old = maxSeq.Load() {
							}
						}
					}
				case errorLimit(body) == "household_send_rate":
					refused.Store(true)
				}
				if resp.Close {
					return
				}
			}
		})
	}
	wg.Wait()
	if !refused.Load() && ctx.Err() == nil {
		elapsed := time.Since(start).Seconds()
		allowed := w.h.householdBurst + w.h.householdRate*(elapsed+0.5) + conns
		if float64(accepted.Load()) > allowed {
			w.h.note(ctx, kind, fmt.Sprintf("%d accepted in %.1f s, never refused", accepted.Load(), elapsed), "household bucket never refused")
		} else {
			w.h.note(ctx, kind, "bucket not emptied in time", "")
		}
	}
	if seq := maxSeq.Load(); seq > 0 {
		b, _ := json.Marshal(ackRequest{Cursor: seq})
		w.quick(ctx, "ack after a household burst", rawRequest(http.MethodPost, "/v1/ack", w.jsonHeaders(), b), false)
	}
}

// answerOutcome names an answer, "<status> <code> (<limit>)", and says
// what in it fails the run.
func answerOutcome(resp *http.Response, body []byte, refuse bool) (outcome, fail string) {
	outcome = strconv.Itoa(resp.StatusCode)
	var eb errorBody
	if resp.StatusCode >= 400 && decodeError(resp, body, &eb) == nil && eb.Error != "" {
		outcome += " " + eb.Error
		if eb.Limit != "" {
			outcome += " (" + eb.Limit + ")"
		}
	}
	switch {
	case resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable:
		fail = "5xx"
	case refuse && resp.StatusCode >= 200 && resp.StatusCode < 300:
		fail = "accepted"
	}
	return outcome, fail
}

// decodeError reads an error body in the codec the answer names.
func decodeError(resp *http.Response, body []byte, eb *errorBody) error {
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/msgpack") {
		return msgpack.Unmarshal(body, eb)
	}
	return json.Unmarshal(body, eb)
}

// errorLimit is the "limit" of a JSON error body.
func errorLimit(body []byte) string {
	var eb errorBody
	_ = json.Unmarshal(body, &eb)
	return eb.Limit
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// transport counts a request that got no answer: a reset or a closed
// connection is the relay's right, no connection at all is a failure
// unless a relay was down for a crash the tester caused.
func (h *Hostile) transport(ctx context.Context, kind string, relay int, from time.Time, err error) {
	crash := h.windows.InCrashWindow(relay, from, time.Now(), err)
	var outcome, fail string
	switch {
	case crash:
		outcome = "relay down (crash)"
	case isTimeout(err):
		outcome, fail = "no answer", fmt.Sprintf("connection not closed within %s", h.closeLimit)
	case errors.Is(err, syscall.ECONNREFUSED):
		outcome, fail = "connection refused", "relay unreachable"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		outcome = "reset, no answer"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		outcome = "closed, no answer"
	default:
		outcome = "transport error"
		fail = err.Error()
	}
	h.note(ctx, kind, outcome, fail)
}

func (h *Hostile) count() {
	h.mu.Lock()
	h.requests++
	h.mu.Unlock()
}

// note counts an outcome of kind and, if fail is set, a failure. A request
// cut because the run ended is neither.
func (h *Hostile) note(ctx context.Context, kind, outcome, fail string) {
	if ctx.Err() != nil {
		outcome, fail = "cut at the end", ""
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.outcomes[kind]
	if m == nil {
		m = map[string]int{}
		h.outcomes[kind] = m
	}
	m[outcome]++
	if fail != "" {
		h.failures[kind+": "+fail]++
	}
}

// Summary returns the report's account of the hostile requests.
func (h *Hostile) Summary() *report.Hostile {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := &report.Hostile{
		Connections:       h.n,
		Requests:          h.requests,
		Outcomes:          h.outcomes,
		Failures:          h.failures,
		CloseLimitSeconds: math.Round(h.closeLimit.Seconds()*10) / 10,
	}
	if h.slow != nil {
		out.SlowReaders = h.slow.n
		out.SlowReaderRounds, out.SlowReaderConnections, out.SlowReaderLimitSeconds, out.TCPMemoryStartBytes, out.TCPMemoryPeakBytes = h.slow.summary()
	}
	return out
}

// joinMsg joins two failures' descriptions.
func joinMsg(a, b string) string {
	if a == "" {
		return b
	}
	return fmt.Sprintf("%s; %s", a, b)
}
