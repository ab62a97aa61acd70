// Package pairtest runs, for tests, a real relay on a fake clock behind a
// small server that answers POST /v1/pair and POST /v1/renew as
// docs/PROTOCOL.md's pairing contract says, for the clients' tests to
// drive both clocks.
package pairtest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/config"
	"github.com/flamenet/relay/relay"
	"github.com/flamenet/relay/store/sqlite"
	"github.com/flamenet/relay/token"
	"github.com/flamenet/relay/wake/local"
)

// Clock is the time of the relay and of the clients in a test: it
// moves only when the test moves it.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

func NewClock() *Clock {
	return &Clock{t: time.Now().UTC().Truncate(time.Second)}
}

func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// StartRelay starts a relay on SQLite whose clock is clock: it
// judges tokens' expiry by it.
func StartRelay(t *testing.T, clock *Clock) (string, ed25519.PrivateKey) {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var cfg relay.Config
	config.Default().CopyTo(&cfg)
	cfg.IssuerKeys = []ed25519.PublicKey{pub}
	cfg.HouseholdSendRate, cfg.HouseholdSendBurst = cfg.SendRate, cfg.SendBurst
	db, err := sqlite.Open(context.Background(), sqlite.Config{Path: filepath.Join(t.TempDir(), "relay.db"), Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := relay.New(cfg, relay.Deps{Store: db, Hub: local.New(nil), Now: clock.Now})
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	out := make(chan error, 1)
	go func() { out <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("stopping the relay: %v", err)
		}
		if err := <-out; err != nil {
			t.Errorf("relay: %v", err)
		}
		db.Close()
	})
	return "http://" + ln.Addr().String(), key
}

// Contract is a real relay behind a small server of the test's own
// that answers POST /v1/pair and POST /v1/renew as docs/PROTOCOL.md's
// pairing contract says (single-use codes and secrets, rotation, reuse
// detection with its 30 s grace) and passes every other request through.
// It counts what the clients did.
type Contract struct {
	URL   string
	Clock *Clock
	key   ed25519.PrivateKey
	ttl   time.Duration // access tokens' life

	// Renewed receives a value when a renewal arrives (when not full).
	Renewed chan struct{}

	// Mu guards what follows.
	Mu        sync.Mutex
	codes     map[string]string // code -> device
	secrets   map[[32]byte]*secret
	renewals  int
	RenewedAt []time.Time   // the clock's time of each renewal
	Hold      chan struct{} // when set, a renewal waits for it to close
	refused   int           // 401s the relay answered to passed-through requests
	Bearers   []string      // tokens of passed-through requests, in order
}

type secret struct {
	household, device string
	used              time.Time
	successor         *secret
	revoked           bool
	expires           time.Time
}

// Household is the household of every device.
const Household = "home"

// NewContract starts a relay on clock and the contract's server in
// front of it; pair and renew mint access tokens of life ttl.
func NewContract(t *testing.T, clock *Clock, ttl time.Duration) *Contract {
	t.Helper()
	relayURL, key := StartRelay(t, clock)
	target, err := url.Parse(relayURL)
	if err != nil {
		t.Fatal(err)
	}
	cr := &Contract{Clock: clock, key: key, ttl: ttl, codes: map[string]string{}, secrets: map[[32]byte]*secret{}, Renewed: make(chan struct{}, 1000)}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if resp.StatusCode == http.StatusUnauthorized {
			cr.Mu.Lock()
			cr.refused++
			cr.Mu.Unlock()
		}
		return nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/pair", cr.pair)
	mux.HandleFunc("POST /v1/renew", cr.renew)
	cr.control(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		cr.Mu.Lock()
		cr.Bearers = append(cr.Bearers, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		cr.Mu.Unlock()
		proxy.ServeHTTP(w, r)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	cr.URL = srv.URL
	return cr
}

// Invite makes a one-time code for device.
func (cr *Contract) Invite(device string) string {
	b := make([]byte, 8)
	rand.Read(b)
	code := base64.RawURLEncoding.EncodeToString(b)
	cr.Mu.Lock()
	cr.codes[code] = device
	cr.Mu.Unlock()
	return code
}

// Mint is a device token of Household valid for life on the clock.
func (cr *Contract) Mint(device string, life time.Duration) string {
	now := cr.Clock.Now()
	tok, err := token.Mint(cr.key, token.Claims{Household: Household, Device: device, IssuedAt: now, Expires: now.Add(life)})
	if err != nil {
		panic(err)
	}
	return tok
}

// Counts are the renewals asked for and the 401s the relay answered.
func (cr *Contract) Counts() (renewals, refused int) {
	cr.Mu.Lock()
	defer cr.Mu.Unlock()
	return cr.renewals, cr.refused
}

func unauthorized(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	w.Write([]byte(`{"error":"unauthorized","message":"The code or renewal secret is not valid."}`))
}

// issue answers with a new set for device; cr.mu is held.
func (cr *Contract) issue(w http.ResponseWriter, device string) *secret {
	now := cr.Clock.Now()
	raw := make([]byte, 32)
	rand.Read(raw)
	sec := "fnr1." + base64.RawURLEncoding.EncodeToString(raw)
	s := &secret{household: Household, device: device, expires: now.Add(90 * 24 * time.Hour)}
	cr.secrets[sha256.Sum256([]byte(sec))] = s
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]string{
		"household": Household, "device": device, "scope": "device",
		"access_token": cr.Mint(device, cr.ttl), "access_expires_at": now.Add(cr.ttl).Format(time.RFC3339Nano),
		"renewal_secret": sec, "renewal_expires_at": s.expires.Format(time.RFC3339Nano),
	})
	return s
}

func (cr *Contract) pair(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Code string `json:"code"`
	}
	if json.NewDecoder(r.Body).Decode(&req) != nil {
		http.Error(w, `{"error":"bad_request"}`, http.StatusBadRequest)
		return
	}
	cr.Mu.Lock()
	defer cr.Mu.Unlock()
	device, ok := cr.codes[req.Code]
	if !ok {
		unauthorized(w)
		return
	}
	delete(cr.codes, req.Code)
	cr.issue(w, device)
}

func (cr *Contract) renew(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Secret string `json:"renewal_secret"`
	}
	if json.NewDecoder(r.Body).Decode(&req) != nil {
		http.Error(w, `{"error":"bad_request"}`, http.StatusBadRequest)
		return
	}
	cr.Mu.Lock()
	cr.renewals++
	cr.RenewedAt = append(cr.RenewedAt, cr.Clock.Now())
	hold := cr.Hold
	cr.Mu.Unlock()
	select {
	case cr.Renewed <- struct{}{}:
	default: // nobody is counting
	}
	if hold != nil {
		<-hold
	}
	cr.Mu.Lock()
	defer cr.Mu.Unlock()
	now := cr.Clock.Now()
	s, ok := cr.secrets[sha256.Sum256([]byte(req.Secret))]
	switch {
	case !ok || s.revoked || !now.Before(s.expires):
		unauthorized(w)
	case s.used.IsZero():
		s.used = now
		s.successor = cr.issue(w, s.device)
	case now.Sub(s.used) < 30*time.Second && s.successor.used.IsZero():
		// A retry of a lost answer: the successor goes, a new one comes.
		s.successor.revoked = true
		s.successor = cr.issue(w, s.device)
	default:
		// Reuse: every secret of the device is revoked.
		for _, o := range cr.secrets {
			if o.household == s.household && o.device == s.device {
				o.revoked = true
			}
		}
		unauthorized(w)
	}
}

// control serves, under /_test/, what a test in another process (the
// TypeScript client's, run by Node) needs to drive the contract: the
// clock, invitations, tokens, counts, and holding renewals.
func (cr *Contract) control(mux *http.ServeMux) {
	reply := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
	// GET: the clock in ms since the epoch; POST ?ms=N: moved on N ms first.
	mux.HandleFunc("/_test/clock", func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			ms, err := strconv.ParseInt(r.URL.Query().Get("ms"), 10, 64)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			cr.Clock.Advance(time.Duration(ms) * time.Millisecond)
		}
		reply(w, cr.Clock.Now().UnixMilli())
	})
	mux.HandleFunc("POST /_test/invite", func(w http.ResponseWriter, r *http.Request) {
		reply(w, cr.Invite(r.URL.Query().Get("device")))
	})
	// ?device=D&secs=N: a token of D living N s on the clock.
	mux.HandleFunc("POST /_test/mint", func(w http.ResponseWriter, r *http.Request) {
		secs, _ := strconv.Atoi(r.URL.Query().Get("secs"))
		reply(w, cr.Mint(r.URL.Query().Get("device"), time.Duration(secs)*time.Second))
	})
	mux.HandleFunc("GET /_test/counts", func(w http.ResponseWriter, r *http.Request) {
		renewals, refused := cr.Counts()
		reply(w, map[string]int{"renewals": renewals, "refused": refused})
	})
	// Holds the next renewal until a second one arrives or 2 s pass,
	// so that calls that each renew would show it.
	mux.HandleFunc("POST /_test/hold", func(w http.ResponseWriter, r *http.Request) {
		for len(cr.Renewed) > 0 { // forget the renewals before this
			<-cr.Renewed
		}
		hold := make(chan struct{})
		cr.Mu.Lock()
		cr.Hold = hold
		cr.Mu.Unlock()
		go func() {
			defer close(hold)
			<-cr.Renewed
			select {
			case <-cr.Renewed:
			case <-time.After(2 * time.Second):
			}
		}()
		reply(w, true)
	})
}
