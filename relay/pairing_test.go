package relay

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/pairing"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/internal/wire"
	"github.com/flamenet/relay/store/sqlite"
	"github.com/flamenet/relay/token"
	"github.com/flamenet/relay/wake/local"
)

// clock is a fake clock a test moves by hand.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }
func (c *clock) set(t time.Time)         { c.ns.Store(t.UnixNano()) }

// newPairingHarness is a relay on SQLite whose clock the test moves.
func newPairingHarness(t *testing.T, mutate func(*Config)) (*harness, *clock) {
	t.Helper()
	h, clk, _ := newPairingHarnessLog(t, mutate)
	return h, clk
}

// newPairingHarnessLog is newPairingHarness with its log, JSON lines, in
// a buffer.
func newPairingHarnessLog(t *testing.T, mutate func(*Config)) (*harness, *clock, *servicetest.Buffer) {
	t.Helper()
	return newPairingHarnessIn(t, filepath.Join(t.TempDir(), "relay.db"), mutate)
}

// newPairingHarnessAt is newPairingHarness with its database at path.
func newPairingHarnessAt(t *testing.T, path string) (*harness, *clock) {
	t.Helper()
	h, clk, _ := newPairingHarnessIn(t, path, nil)
	return h, clk
}

func newPairingHarnessIn(t *testing.T, path string, mutate func(*Config)) (*harness, *clock, *servicetest.Buffer) {
	t.Helper()
	log := &servicetest.Buffer{}
	db, err := sqlite.Open(context.Background(), sqlite.Config{Path: path, Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	clk := newClock()
	h := newHarnessWith(t, Deps{Store: db, Hub: local.New(nil), Now: clk.now, Logger: slog.New(slog.NewJSONHandler(log, nil))}, mutate)
	h.db = db
	return h, clk, log
}

// adminAt is an admin token of household home issued at the clock's now.
func (h *harness) adminAt(now time.Time) string {
	h.t.Helper()
	return h.mint(token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: now, Expires: now.Add(time.Hour)})
}

func (h *harness) invite(admin, device, scope string) pairing.InvitationResponse {
	h.t.Helper()
	return h.inviteWith(admin, map[string]any{"device": device, "scope": scope})
}

// inviteReplacing invites device, replacing the device of that name.
func (h *harness) inviteReplacing(admin, device string) pairing.InvitationResponse {
	h.t.Helper()
	return h.inviteWith(admin, map[string]any{"device": device, "replace": true})
}

func (h *harness) inviteWith(admin string, body map[string]any) pairing.InvitationResponse {
	h.t.Helper()
	if body["scope"] == "" {
		delete(body, "scope")
	}
	var out pairing.InvitationResponse
	h.must("POST", "/v1/invitations", admin, body, http.StatusCreated).json(h.t, &out)
	return out
}

func (h *harness) pairWith(body any, want int) pairing.CredentialsResponse {
	h.t.Helper()
	return h.pairWithHeader(body, want)
}

func (h *harness) pairWithHeader(body any, want int, header ...string) pairing.CredentialsResponse {
	h.t.Helper()
	var out pairing.CredentialsResponse
	r := h.must("POST", "/v1/pair", "", body, want, header...)
	if want == http.StatusOK {
		r.json(h.t, &out)
	}
	return out
}

func (h *harness) renewWith(secret string, want int) pairing.CredentialsResponse {
	h.t.Helper()
	var out pairing.CredentialsResponse
	r := h.must("POST", "/v1/renew", "", map[string]any{"renewal_secret": secret}, want)
	if want == http.StatusOK {
		r.json(h.t, &out)
	}
	return out
}

// TestPairEndToEnd: an admin invites, the device pairs with the code and
// gets a working token of the invited scope and a renewal secret; renewal
// rotates; the code is single use.
func TestPairEndToEnd(t *testing.T) {
	h, clk := newPairingHarness(t, func(c *Config) { c.AccessTokenTTL = 20 * time.Minute })
	now := clk.now()
	admin := h.adminAt(now)
	inv := h.invite(admin, "phone", "")
	if inv.Device != "phone" || inv.Scope != "device" || inv.Household != "home" {
		t.Fatalf("invitation %+v", inv)
	}
	if want := h.url + "/pair/#code=" + inv.Code + "&household=home"; inv.URL != want {
		t.Errorf("url = %q, want %q", inv.URL, want)
	}
	if want := wire.Timestamp(now.UTC().Truncate(time.Microsecond).Add(10 * time.Minute)); inv.ExpiresAt != want {
		t.Errorf("expires_at = %q, want %q", inv.ExpiresAt, want)
	}
	key := []byte(h.key.Public().(ed25519.PublicKey)) // any valid Ed25519 public key
	c := h.pairWith(map[string]any{"code": inv.Code, "identity_key": key}, http.StatusOK)
	if c.Household != "home" || c.Device != "phone" || c.Scope != "device" || !pairing.ValidRenewalSecret(c.RenewalSecret) {
		t.Fatalf("pair = %+v", c)
	}
	claims, err := token.Verify(c.AccessToken, h.srv.keys, clk.now())
	if err != nil {
		t.Fatal(err)
	}
	if claims.Household != "home" || claims.Device != "phone" || claims.Scope != "device" ||
		!claims.IssuedAt.Equal(now.UTC().Truncate(time.Microsecond)) || !claims.Expires.Equal(claims.IssuedAt.Add(20*time.Minute).Truncate(time.Second)) {
		t.Errorf("claims %+v, want home/phone/device issued now (to the microsecond) for 20m", claims)
	}
	if want := wire.Timestamp(claims.Expires); c.AccessExpiresAt != want {
		t.Errorf("access_expires_at = %q, want %q", c.AccessExpiresAt, want)
	}
	if want := wire.Timestamp(now.UTC().Truncate(time.Microsecond).Add(90 * 24 * time.Hour)); c.RenewalExpiresAt != want {
		t.Errorf("renewal_expires_at = %q, want %q", c.RenewalExpiresAt, want)
	}
	// The token works, and the device is registered with its key.
	var list devicesResponse
	h.must("GET", "/v1/devices", c.AccessToken, nil, http.StatusOK).json(t, &list)
	if len(list.Devices) != 1 || list.Devices[0].Device != "phone" || string(list.Devices[0].IdentityKey) != string(key) || list.Devices[0].PushKind != "none" {
		t.Fatalf("devices = %+v", list.Devices)
	}
	// The admin sees the redemption and the key.
	var ins pairing.InvitationsResponse
	h.must("GET", "/v1/invitations", admin, nil, http.StatusOK).json(t, &ins)
	if len(ins.Invitations) != 1 || ins.Invitations[0].RedeemedAt == nil || string(ins.Invitations[0].IdentityKey) != string(key) {
		t.Fatalf("invitations = %+v", ins)
	}
	// Single use.
	h.pairWith(map[string]any{"code": inv.Code}, http.StatusUnauthorized)

	clk.advance(15 * time.Minute)
	r := h.renewWith(c.RenewalSecret, http.StatusOK)
	if r.RenewalSecret == c.RenewalSecret || r.Device != "phone" {
		t.Fatalf("renew = %+v", r)
	}
	if _, err := token.Verify(r.AccessToken, h.srv.keys, clk.now()); err != nil {
		t.Fatal(err)
	}
	h.renewWith(r.RenewalSecret, http.StatusOK)
}

// TestInvitationScopes: only admin tokens invite or list; an admin
// invitation pairs an admin device; bad requests are 400.
func TestInvitationScopes(t *testing.T) {
	h, clk := newPairingHarness(t, nil)
	dev := h.mint(token.Claims{Household: "home", Device: "phone", IssuedAt: clk.now(), Expires: clk.now().Add(time.Hour)})
	if code := h.must("POST", "/v1/invitations", dev, map[string]any{"device": "x"}, http.StatusForbidden).errCode(t); code != codeForbidden {
		t.Errorf("device token inviting: %s", code)
	}
	h.must("GET", "/v1/invitations", dev, nil, http.StatusForbidden)
	h.must("POST", "/v1/invitations", "", map[string]any{"device": "x"}, http.StatusUnauthorized)
	admin := h.adminAt(clk.now())
	for _, body := range []string{`{"device":"bad name"}`, `{}`, `{"device":"x","scope":"root"}`, `{"device":`, `[1]`} {
		if code := h.must("POST", "/v1/invitations", admin, body, http.StatusBadRequest).errCode(t); code != codeBadRequest {
			t.Errorf("%s: %s", body, code)
		}
	}
	h.must("POST", "/v1/invitations", admin, `{"device":"x","pad":"`+strings.Repeat("x", 1<<10)+`"}`, http.StatusRequestEntityTooLarge)
	inv := h.invite(admin, "tablet", "admin")
	c := h.pairWith(map[string]any{"code": inv.Code}, http.StatusOK)
	if c.Scope != "admin" {
		t.Fatalf("scope %q, want admin", c.Scope)
	}
	// The paired admin may invite in turn.
	h.invite(c.AccessToken, "watch", "")
}

// TestTypedCodePairs: a code redeems however it is typed (case, dashes
// as spaces, O for 0, L for 1); pairing's TestCodeNormalization has the
// rules.
func TestTypedCodePairs(t *testing.T) {
	h, clk := newPairingHarness(t, nil)
	inv := h.invite(h.adminAt(clk.now()), "phone", "")
	typed := strings.ToLower(strings.ReplaceAll(inv.Code, "-", " "))
	typed = strings.NewReplacer("0", "o", "1", "l").Replace(typed)
	h.pairWith(map[string]any{"code": typed}, http.StatusOK)
}

// TestPairOnlyScope: a pairing that names the scope it can use (as the
// console does: admin) is refused, as a wrong code is, for a code of
// another scope, which stays unspent for the device it was made for; a
// scope that is neither is a 400.
func TestPairOnlyScope(t *testing.T) {
	h, clk := newPairingHarness(t, nil)
	admin := h.adminAt(clk.now())
	phone := h.invite(admin, "phone", "")
	h.pairWith(map[string]any{"code": phone.Code, "scope": "admin"}, http.StatusUnauthorized)
	if g := h.pairWith(map[string]any{"code": phone.Code}, http.StatusOK); g.Device != "phone" || g.Scope != token.ScopeDevice {
		t.Fatalf("the phone's code after the console's refusal paired %+v", g)
	}
	laptop := h.invite(admin, "laptop", token.ScopeAdmin)
	if g := h.pairWith(map[string]any{"code": laptop.Code, "scope": "admin"}, http.StatusOK); g.Scope != token.ScopeAdmin {
		t.Fatalf("an admin's code asked for as an admin's paired %+v", g)
	}
	h.pairWith(map[string]any{"code": laptop.Code, "scope": "owner"}, http.StatusBadRequest)
}

// TestPairRefusalsAlike: every refused code or secret (wrong, malformed,
// used, expired, replaced, removed, revoked, reused) gets the same 401
// with the same body; the reason is in the log only.
func TestPairRefusalsAlike(t *testing.T) {
	h, clk, log := newPairingHarnessLog(t, func(c *Config) { c.PairRatePerAddress = 1000 })
	admin := h.adminAt(clk.now())
	used := h.invite(admin, "used", "")
	first := h.pairWith(map[string]any{"code": used.Code}, http.StatusOK)
	expired := h.invite(admin, "late", "")
	replaced := h.invite(admin, "twice", "")
	h.invite(admin, "twice", "")
	removed := h.invite(admin, "gone", "")
	gone := h.pairWith(map[string]any{"code": removed.Code}, http.StatusOK)
	removedAgain := h.inviteReplacing(admin, "gone") // pending when removed
	clk.advance(time.Second)
	h.must("DELETE", "/v1/devices/gone", h.adminAt(clk.now()), nil, http.StatusNoContent)
	second := h.renewWith(first.RenewalSecret, http.StatusOK)
	clk.advance(11 * time.Minute) // past the invitations' lives and the retry grace

	var bodies []string
	check := func(path string, body any) {
		t.Helper()
		r := h.must("POST", path, "", body, http.StatusUnauthorized)
		if r.errCode(t) != codeUnauthorized {
			t.Errorf("%s %v: %s", path, body, r.body)
		}
		bodies = append(bodies, string(r.body))
	}
	check("/v1/pair", map[string]any{"code": "00000-00000"})                         // unknown
	check("/v1/pair", map[string]any{"code": "not a code"})                          // malformed
	check("/v1/pair", map[string]any{"code": used.Code})                             // used
	check("/v1/pair", map[string]any{"code": expired.Code})                          // expired
	check("/v1/pair", map[string]any{"code": replaced.Code})                         // replaced
	check("/v1/pair", map[string]any{"code": removedAgain.Code})                     // removed
	check("/v1/renew", map[string]any{"renewal_secret": "fnr1.x"})                   // malformed
	check("/v1/renew", map[string]any{"renewal_secret": pairing.NewRenewalSecret()}) // unknown
	check("/v1/renew", map[string]any{"renewal_secret": gone.RenewalSecret})         // removed
	check("/v1/renew", map[string]any{"renewal_secret": first.RenewalSecret})        // reused: revokes
	check("/v1/renew", map[string]any{"renewal_secret": second.RenewalSecret})       // revoked
	for _, b := range bodies[1:] {
		if b != bodies[0] {
			t.Errorf("refusal bodies differ: %q and %q", bodies[0], b)
		}
	}
	// The log tells each refusal's real reason, in order.
	var reasons []string
	for line := range strings.Lines(log.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == "pairing refused" {
			reasons = append(reasons, m["reason"].(string))
		}
	}
	// (A removal forgets the device's invitations and secrets: unknown.)
	want := []string{"unknown", "malformed", "used", "expired", "unknown", "unknown", "malformed", "unknown", "unknown", "reused", "revoked"}
	if strings.Join(reasons, " ") != strings.Join(want, " ") {
		t.Errorf("logged reasons %q, want %q", reasons, want)
	}
}
