// Package pairtest runs, for tests, a real relay on a fake clock behind a
// small server that answers POST /v1/pair and POST /v1/renew as
// docs/PROTOCOL.md's pairing contract says, for the clients' tests to
// drive both clocks.
package pairtest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
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

	"github.com/flamenet/relay/internal/config"
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
func StartRelay(t *testing.T, clock *Clock, mutate func(*relay.Config, ed25519.PrivateKey)) (string, ed25519.PrivateKey) {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var cfg relay.Config
	config.Default().CopyTo(&cfg)
	cfg.IssuerKeys = []ed25519.PublicKey{pub}
	cfg.HouseholdSendRate, cfg.HouseholdSendBurst = cfg.SendRate, cfg.SendBurst
	if mutate != nil {
		mutate(&cfg, key)
	}
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
	URL      string
	Clock    *Clock
	mode     Mode
	relayURL string
	key      ed25519.PrivateKey
	ttl      time.Duration // access tokens' life

	// Renewed receives a value when a renewal arrives (when not full).
	Renewed chan struct{}

	// Mu guards what follows.
	Mu        sync.Mutex
	codes     map[string]string // code -> device
	keys      map[string]string // device -> identity key given when pairing
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

// Mode says who answers pair and renew.
type Mode string

const (
	// Own: the test's own server, as the contract says.
	Own Mode = "own"
	// Real: the relay's own endpoints; the test's server in front only
	// counts and holds renewals and passes them through.
	Real Mode = "relay"
)

// Modes returns both modes.
func Modes() []Mode { return []Mode{Own, Real} }

// enablePairing turns the relay's own pairing on (it holds the issuer's
// private key) with access tokens of life ttl.
func enablePairing(cfg *relay.Config, key ed25519.PrivateKey, ttl time.Duration) {
	cfg.IssuerKey = key
	cfg.AccessTokenTTL = ttl
	// Tests pair and renew far more often than a household does.
	cfg.PairRatePerAddress, cfg.PairRate = 1_000_000, 1_000_000
}

// NewContract starts a relay on clock and the test's server in front of
// it, answering pair and renew itself with access tokens of life ttl.
func NewContract(t *testing.T, clock *Clock, ttl time.Duration) *Contract {
	return NewContractMode(t, Own, clock, ttl)
}

// NewContractMode is NewContract with pair and renew answered as mode
// says.
func NewContractMode(t *testing.T, mode Mode, clock *Clock, ttl time.Duration) *Contract {
	t.Helper()
	var mutate func(*relay.Config, ed25519.PrivateKey)
	if mode == Real {
		mutate = func(cfg *relay.Config, key ed25519.PrivateKey) { enablePairing(cfg, key, ttl) }
	}
	relayURL, key := StartRelay(t, clock, mutate)
	target, err := url.Parse(relayURL)
	if err != nil {
		t.Fatal(err)
	}
	cr := &Contract{mode: mode, relayURL: relayURL, Clock: clock, key: key, ttl: ttl, codes: map[string]string{}, keys: map[string]string{}, secrets: map[[32]byte]*secret{}, Renewed: make(chan struct{}, 1000)}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if p := resp.Request.URL.Path; resp.StatusCode == http.StatusUnauthorized && p != "/v1/pair" && p != "/v1/renew" {
			cr.Mu.Lock()
			cr.refused++
			cr.Mu.Unlock()
		}
		return nil
	}
	mux := http.NewServeMux()
	if mode == Real {
		mux.HandleFunc("POST /v1/pair", proxy.ServeHTTP)
		mux.HandleFunc("POST /v1/renew", func(w http.ResponseWriter, r *http.Request) {
			cr.arrived()
			proxy.ServeHTTP(w, r)
		})
	} else {
		mux.HandleFunc("POST /v1/pair", cr.pair)
		mux.HandleFunc("POST /v1/renew", cr.renew)
		// A removal revokes the device's renewal secrets, as the
		// contract says, then goes to the relay.
		mux.HandleFunc("DELETE /v1/devices/{device}", func(w http.ResponseWriter, r *http.Request) {
			cr.Mu.Lock()
			for _, s := range cr.secrets {
				if s.device == r.PathValue("device") {
					s.revoked = true
				}
			}
			cr.Mu.Unlock()
			proxy.ServeHTTP(w, r)
		})
	}
	cr.control(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		cr.Mu.Lock()
		cr.Bearers = append(cr.Bearers, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		cr.Mu.Unlock()
		proxy.ServeHTTP(w, r)
	})
	// The URL is set before the server serves: its handlers read it (a
	// removal calls the relay through it), and a request that came from a
	// process the test started is ordered after nothing the race detector
	// can see.
	srv := httptest.NewUnstartedServer(mux)
	cr.URL = "http://" + srv.Listener.Addr().String()
	srv.Start()
	t.Cleanup(srv.Close)
	return cr
}

// arrived counts a renewal and, when a hold is set, waits for it.
func (cr *Contract) arrived() {
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
}

// Invite makes a one-time code for device: in Real mode, the relay's
// (POST /v1/invitations with an admin token).
func (cr *Contract) Invite(device string) string {
	if cr.mode == Real {
		return cr.relayInvite(device)
	}
	b := make([]byte, 8)
	rand.Read(b)
	code := base64.RawURLEncoding.EncodeToString(b)
	cr.Mu.Lock()
	cr.codes[code] = device
	cr.Mu.Unlock()
	return code
}

// Mint returns a device token of Household valid for life on the clock.
func (cr *Contract) Mint(device string, life time.Duration) string {
	now := cr.Clock.Now()
	tok, err := token.Mint(cr.key, token.Claims{Household: Household, Device: device, IssuedAt: now, Expires: now.Add(life)})
	if err != nil {
		panic(err)
	}
	return tok
}

// Counts returns the renewals asked for and the 401s the relay answered.
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
		Code        string `json:"code"`
		IdentityKey string `json:"identity_key"`
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
	cr.keys[device] = req.IdentityKey
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
	cr.arrived()
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
	mux.HandleFunc("GET /_test/identity", func(w http.ResponseWriter, r *http.Request) {
		reply(w, cr.IdentityKey(r.URL.Query().Get("device")))
	})
	mux.HandleFunc("POST /_test/remove", func(w http.ResponseWriter, r *http.Request) {
		if err := cr.Remove(r.URL.Query().Get("device")); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		reply(w, true)
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

// IdentityKey returns the identity key (base64) device gave when it paired:
// in Real mode, as the relay's GET /v1/invitations lists it.
func (cr *Contract) IdentityKey(device string) string {
	if cr.mode != Real {
		cr.Mu.Lock()
		defer cr.Mu.Unlock()
		return cr.keys[device]
	}
	req, err := http.NewRequest(http.MethodGet, cr.relayURL+"/v1/invitations", nil)
	if err != nil {
		panic(err)
	}
	req.Header.Set("Authorization", "Bearer "+cr.admin())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	var out struct {
		Invitations []struct {
			Device      string  `json:"device"`
			IdentityKey *string `json:"identity_key"`
		} `json:"invitations"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		panic(fmt.Sprintf("GET /v1/invitations: %d %v", resp.StatusCode, err))
	}
	for _, inv := range out.Invitations {
		if inv.Device == device && inv.IdentityKey != nil {
			return *inv.IdentityKey
		}
	}
	return ""
}

// Remove removes device as an admin device would (DELETE
// /v1/devices/{device}).
func (cr *Contract) Remove(device string) error {
	req, err := http.NewRequest(http.MethodDelete, cr.URL+"/v1/devices/"+device, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+cr.admin())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("DELETE /v1/devices/%s: %s", device, resp.Status)
	}
	return nil
}

// admin returns an admin token of Household.
func (cr *Contract) admin() string {
	now := cr.Clock.Now()
	tok, err := token.Mint(cr.key, token.Claims{Household: Household, Device: "admin", Scope: token.ScopeAdmin, IssuedAt: now, Expires: now.Add(time.Hour)})
	if err != nil {
		panic(err)
	}
	return tok
}

// relayInvite asks the relay for an invitation as an admin device would.
func (cr *Contract) relayInvite(device string) string {
	body, _ := json.Marshal(map[string]string{"device": device})
	req, err := http.NewRequest(http.MethodPost, cr.relayURL+"/v1/invitations", bytes.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Authorization", "Bearer "+cr.admin())
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	var out struct {
		Code string `json:"code"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusCreated || out.Code == "" {
		panic(fmt.Sprintf("POST /v1/invitations: %d %v", resp.StatusCode, err))
	}
	return out.Code
}
