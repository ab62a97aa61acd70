package relay

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/pairing"
	"github.com/flamenet/relay/internal/wire"
	"github.com/flamenet/relay/push"
	"github.com/flamenet/relay/token"
)

// TestPairingOff: a relay that mints no tokens (IssuerKey nil: they come
// from another issuer) answers 404 not_found to the four pairing
// endpoints, before looking at the token or the body, and serves the rest.
func TestPairingOff(t *testing.T) {
	h, clk := newPairingHarness(t, func(c *Config) { c.IssuerKey = nil })
	admin := h.adminAt(clk.now())
	for _, r := range []struct{ method, path, tok, body string }{
		{"POST", "/v1/invitations", admin, `{"device":"phone"}`},
		{"GET", "/v1/invitations", admin, ""},
		{"POST", "/v1/invitations", "", `{"device":"phone"}`},
		{"POST", "/v1/pair", "", `{"code":"ABCDE-FGHJK"}`},
		{"POST", "/v1/renew", "", `{"renewal_secret":"` + pairing.NewRenewalSecret() + `"}`},
	} {
		if code := h.must(r.method, r.path, r.tok, r.body, http.StatusNotFound).errCode(t); code != codeNotFound {
			t.Errorf("%s %s: %s, want not_found", r.method, r.path, code)
		}
	}
	h.must("GET", "/v1/devices", admin, nil, http.StatusOK)
}

// TestPairBodies: pair and renew bodies above 1 KiB are 413, bodies that
// are not JSON or not of the request's shape 400, an identity key that is
// not an Ed25519 public key 400; none of these reaches the store.
func TestPairBodies(t *testing.T) {
	h, clk := newPairingHarness(t, func(c *Config) { c.PairRatePerAddress = 1000 })
	inv := h.invite(h.adminAt(clk.now()), "phone", "")
	pad := strings.Repeat("x", 1<<10)
	for _, r := range []struct {
		path, body string
		status     int
		code       string
	}{
		{"/v1/pair", `{"code":"` + inv.Code + `","pad":"` + pad + `"}`, 413, codePayloadTooLarge},
		{"/v1/renew", `{"renewal_secret":"x","pad":"` + pad + `"}`, 413, codePayloadTooLarge},
		{"/v1/pair", `{"code":`, 400, codeBadRequest},
		{"/v1/pair", `[1]`, 400, codeBadRequest},
		{"/v1/pair", `{"code":5}`, 400, codeBadRequest},
		{"/v1/pair", ``, 400, codeBadRequest},
		{"/v1/pair", `{"code":"` + inv.Code + `"} {}`, 400, codeBadRequest},
		{"/v1/pair", `{"code":"` + inv.Code + `","identity_key":"AAAA"}`, 400, codeBadRequest},
		{"/v1/pair", `{"code":"` + inv.Code + `","identity_key":5}`, 400, codeBadRequest},
		{"/v1/renew", `{"renewal_secret":`, 400, codeBadRequest},
		{"/v1/renew", `{}`, 400, codeBadRequest},
		{"/v1/renew", `{"renewal_secret":["x"]}`, 400, codeBadRequest},
	} {
		if code := h.must("POST", r.path, "", r.body, r.status).errCode(t); code != r.code {
			t.Errorf("%s %.40q: %s, want %s", r.path, r.body, code, r.code)
		}
	}
	// The code is still unused: none of the above spent it.
	h.pairWith(map[string]any{"code": inv.Code}, http.StatusOK)
}

// TestPairRateLimits: pair and renew attempts from one client address
// (X-Forwarded-For believed only from FN_TRUSTED_PROXIES) are limited to
// its bucket, and all attempts to the relay's; past either, 429
// rate_limited naming the limit, with a Retry-After of the wait for the
// next token; the buckets refill with the clock.
func TestPairRateLimits(t *testing.T) {
	xff := func(a string) []string { return []string{"X-Forwarded-For", a} }
	attempt := func(h *harness, want int, header ...string) reply {
		h.t.Helper()
		return h.must("POST", "/v1/pair", "", `{"code":"00000-00000"}`, want, header...)
	}
	refused := func(t *testing.T, r reply, limit, retryAfter string) {
		t.Helper()
		var e errorBody
		r.json(t, &e)
		if e.Error != codeRateLimited || e.Limit != limit || e.Message == "" {
			t.Errorf("refusal %s, want rate_limited %s", r.body, limit)
		}
		if got := r.header.Get("Retry-After"); got != retryAfter {
			t.Errorf("Retry-After %q, want %q", got, retryAfter)
		}
	}

	t.Run("per address", func(t *testing.T) {
		h, clk := newPairingHarness(t, func(c *Config) {
			c.PairRatePerAddress, c.PairRate = 3, 1000
			c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
		})
		for range 3 {
			attempt(h, http.StatusUnauthorized, xff("192.0.2.1")...)
		}
		// Renew spends the same bucket.
		r := h.must("POST", "/v1/renew", "", map[string]any{"renewal_secret": pairing.NewRenewalSecret()}, http.StatusTooManyRequests, xff("192.0.2.1")...)
		refused(t, r, pairing.LimitAddress, "20") // 3 a minute: one every 20 s
		// Another address has its own bucket.
		attempt(h, http.StatusUnauthorized, xff("192.0.2.2")...)
		clk.advance(19 * time.Second)
		refused(t, attempt(h, http.StatusTooManyRequests, xff("192.0.2.1")...), pairing.LimitAddress, "1")
		clk.advance(time.Second)
		attempt(h, http.StatusUnauthorized, xff("192.0.2.1")...)
	})

	t.Run("untrusted forwarded-for", func(t *testing.T) {
		// Without trusted proxies a client cannot pick its address.
		h, _ := newPairingHarness(t, func(c *Config) { c.PairRatePerAddress, c.PairRate = 3, 1000 })
		for i := range 3 {
			attempt(h, http.StatusUnauthorized, xff("192.0.2."+string(rune('1'+i)))...)
		}
		refused(t, attempt(h, http.StatusTooManyRequests, xff("192.0.2.9")...), pairing.LimitAddress, "20")
	})

	t.Run("global", func(t *testing.T) {
		h, clk := newPairingHarness(t, func(c *Config) {
			c.PairRatePerAddress, c.PairRate = 1000, 4
			c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
		})
		for i := range 4 {
			attempt(h, http.StatusUnauthorized, xff("192.0.2."+string(rune('1'+i)))...)
		}
		refused(t, attempt(h, http.StatusTooManyRequests, xff("192.0.2.8")...), pairing.LimitRate, "15")
		clk.advance(15 * time.Second)
		attempt(h, http.StatusUnauthorized, xff("192.0.2.9")...)
	})
}

// TestRenewRotation: each renewal issues a new secret with a fresh
// lifetime and spends the old one; a secret past its lifetime is refused.
func TestRenewRotation(t *testing.T) {
	h, clk := newPairingHarness(t, func(c *Config) { c.RenewalTTL = time.Hour; c.PairRatePerAddress = 1000 })
	inv := h.invite(h.adminAt(clk.now()), "phone", "")
	c := h.pairWith(map[string]any{"code": inv.Code}, http.StatusOK)
	for range 3 {
		clk.advance(50 * time.Minute) // within the secret's hour, past its predecessor's
		next := h.renewWith(c.RenewalSecret, http.StatusOK)
		if want := wire.Timestamp(clk.now().UTC().Truncate(time.Microsecond).Add(time.Hour)); next.RenewalExpiresAt != want {
			t.Errorf("renewal_expires_at %s, want %s", next.RenewalExpiresAt, want)
		}
		c = next
	}
	clk.advance(time.Hour)
	h.renewWith(c.RenewalSecret, http.StatusUnauthorized)
}

// TestRenewRetryGrace: a secret presented again within 30 s of its use,
// while its successor is unused, is a client retrying a lost answer: the
// successor is revoked and a new one issued. Any other reuse revokes every
// renewal secret of the device; its access tokens live on.
func TestRenewRetryGrace(t *testing.T) {
	fresh := func(t *testing.T) (*harness, *clock, string) {
		h, clk := newPairingHarness(t, func(c *Config) { c.PairRatePerAddress = 1000 })
		return h, clk, h.adminAt(clk.now())
	}

	t.Run("retry", func(t *testing.T) {
		h, clk, admin := fresh(t)
		c := h.pairWith(map[string]any{"code": h.invite(admin, "phone", "").Code}, http.StatusOK)
		lost := h.renewWith(c.RenewalSecret, http.StatusOK)
		clk.advance(29 * time.Second)
		again := h.renewWith(c.RenewalSecret, http.StatusOK)
		if again.RenewalSecret == lost.RenewalSecret {
			t.Fatal("the retry got the lost answer's secret again")
		}
		next := h.renewWith(again.RenewalSecret, http.StatusOK)
		// The lost answer's secret is revoked, and presenting it revokes
		// the device's every secret: its holder may be a thief.
		h.renewWith(lost.RenewalSecret, http.StatusUnauthorized)
		h.renewWith(next.RenewalSecret, http.StatusUnauthorized)
	})

	t.Run("a second retry", func(t *testing.T) {
		h, clk, admin := fresh(t)
		c := h.pairWith(map[string]any{"code": h.invite(admin, "laptop", "").Code}, http.StatusOK)
		h.renewWith(c.RenewalSecret, http.StatusOK)
		clk.advance(time.Second)
		again := h.renewWith(c.RenewalSecret, http.StatusOK)
		clk.advance(time.Second)
		h.renewWith(c.RenewalSecret, http.StatusUnauthorized) // once only
		h.renewWith(again.RenewalSecret, http.StatusUnauthorized)
	})

	t.Run("reuse after the grace", func(t *testing.T) {
		h, clk, admin := fresh(t)
		c := h.pairWith(map[string]any{"code": h.invite(admin, "tablet", "").Code}, http.StatusOK)
		next := h.renewWith(c.RenewalSecret, http.StatusOK)
		clk.advance(30 * time.Second)
		h.renewWith(c.RenewalSecret, http.StatusUnauthorized)
		h.renewWith(next.RenewalSecret, http.StatusUnauthorized) // revoked with it
		// The access token already issued lives until it expires.
		h.must("GET", "/v1/devices", next.AccessToken, nil, http.StatusOK)
	})

	t.Run("reuse after the successor's use", func(t *testing.T) {
		h, _, admin := fresh(t)
		c := h.pairWith(map[string]any{"code": h.invite(admin, "watch", "").Code}, http.StatusOK)
		next := h.renewWith(c.RenewalSecret, http.StatusOK)
		third := h.renewWith(next.RenewalSecret, http.StatusOK)
		h.renewWith(c.RenewalSecret, http.StatusUnauthorized) // within 30 s, but the successor was used
		h.renewWith(third.RenewalSecret, http.StatusUnauthorized)
	})
}

// TestPairAfterRemoval: removing a device revokes its renewal secrets and
// invitations; an invitation made after the removal pairs it again, and
// its token works.
func TestPairAfterRemoval(t *testing.T) {
	h, clk := newPairingHarness(t, nil)
	admin := h.adminAt(clk.now())
	c := h.pairWith(map[string]any{"code": h.invite(admin, "phone", "").Code}, http.StatusOK)
	pending := h.inviteReplacing(admin, "phone")
	clk.advance(time.Second)
	h.must("DELETE", "/v1/devices/phone", h.adminAt(clk.now()), nil, http.StatusNoContent)
	h.renewWith(c.RenewalSecret, http.StatusUnauthorized)
	h.pairWith(map[string]any{"code": pending.Code}, http.StatusUnauthorized)
	h.must("GET", "/v1/devices", c.AccessToken, nil, http.StatusUnauthorized)

	clk.advance(time.Second)
	again := h.pairWith(map[string]any{"code": h.invite(h.adminAt(clk.now()), "phone", "").Code}, http.StatusOK)
	h.must("GET", "/v1/devices", again.AccessToken, nil, http.StatusOK)
	h.renewWith(again.RenewalSecret, http.StatusOK)
}

// TestInvitationLinks: the link's base is FN_PUBLIC_URL when set, else
// the request's Host with https when a trusted proxy says so (and only
// then). Its page depends on the scope: an app device's link opens the
// pairing page (/pair/), which only shows the code; an admin's opens the
// console, which pairs only with a link marked scope=admin.
func TestInvitationLinks(t *testing.T) {
	link := func(h *harness, admin string, header ...string) string {
		t.Helper()
		var dev, adm pairing.InvitationResponse
		h.must("POST", "/v1/invitations", admin, `{"device":"phone"}`, http.StatusCreated, header...).json(t, &dev)
		h.must("POST", "/v1/invitations", admin, `{"device":"tablet","scope":"admin"}`, http.StatusCreated, header...).json(t, &adm)
		app := "/pair/#code=" + dev.Code + "&household=home"
		if !strings.HasSuffix(dev.URL, app) {
			t.Errorf("an app device's url %q does not end in %q", dev.URL, app)
		}
		console := "/console/#pair=" + adm.Code + "&household=home&scope=admin"
		if !strings.HasSuffix(adm.URL, console) {
			t.Errorf("an admin's url %q does not end in %q", adm.URL, console)
		}
		base := strings.TrimSuffix(dev.URL, app)
		if other := strings.TrimSuffix(adm.URL, console); other != base {
			t.Errorf("the links' bases differ: %q and %q", base, other)
		}
		return base
	}
	public, clk := newPairingHarness(t, func(c *Config) { c.PublicURL = "https://relay.example/base" })
	if got := link(public, public.adminAt(clk.now()), "X-Forwarded-Proto", "http"); got != "https://relay.example/base" {
		t.Errorf("with a public URL: %q", got)
	}
	proxied, clk := newPairingHarness(t, func(c *Config) {
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	})
	if got := link(proxied, proxied.adminAt(clk.now()), "X-Forwarded-Proto", "https"); got != "https://"+strings.TrimPrefix(proxied.url, "http://") {
		t.Errorf("behind a trusted proxy: %q", got)
	}
	direct, clk := newPairingHarness(t, nil)
	if got := link(direct, direct.adminAt(clk.now()), "X-Forwarded-Proto", "https"); got != direct.url {
		t.Errorf("from an untrusted peer: %q, want %q", got, direct.url)
	}
}

// TestInvitationsList: an admin sees pending invitations and those
// redeemed in the last 24 hours, with the key the device gave, and never
// a code; a new invitation replaces the device's pending one.
func TestInvitationsList(t *testing.T) {
	h, clk := newPairingHarness(t, nil)
	admin := h.adminAt(clk.now())
	first := h.invite(admin, "phone", "")
	h.invite(admin, "phone", "admin") // replaces first
	h.pairWith(map[string]any{"code": first.Code}, http.StatusUnauthorized)
	tablet := h.invite(admin, "tablet", "")
	key := []byte(h.key.Public().(ed25519.PublicKey))
	h.pairWith(map[string]any{"code": tablet.Code, "identity_key": key}, http.StatusOK)

	list := func() (pairing.InvitationsResponse, []byte) {
		r := h.must("GET", "/v1/invitations", h.adminAt(clk.now()), nil, http.StatusOK)
		var out pairing.InvitationsResponse
		r.json(t, &out)
		return out, r.body
	}
	ins, raw := list()
	if bytes.Contains(raw, []byte(strings.ReplaceAll(tablet.Code, "-", ""))) || bytes.Contains(raw, []byte(tablet.Code)) || bytes.Contains(raw, []byte(`"code"`)) {
		t.Errorf("the list shows a code: %s", raw)
	}
	var generic map[string][]map[string]any
	if err := json.Unmarshal(raw, &generic); err != nil {
		t.Fatal(err)
	}
	if len(ins.Invitations) != 2 || generic["invitations"][0]["device"] != "phone" || generic["invitations"][0]["scope"] != "admin" ||
		generic["invitations"][0]["redeemed_at"] != nil || generic["invitations"][0]["identity_key"] != nil {
		t.Fatalf("invitations %s", raw)
	}
	if tab := ins.Invitations[1]; tab.Device != "tablet" || tab.RedeemedAt == nil || !bytes.Equal(tab.IdentityKey, key) {
		t.Fatalf("tablet %+v", tab)
	}
	clk.advance(24*time.Hour + time.Second)
	if ins, raw := list(); len(ins.Invitations) != 0 {
		t.Errorf("after a day: %s", raw)
	}
}

// TestDevicesPushKind: GET /v1/devices names each device's push kind,
// none for a device without a push target.
func TestDevicesPushKind(t *testing.T) {
	h := newHarness(t, nil)
	fake := newUPFake(t)
	q, err := push.New(push.Config{AllowPrivate: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close(context.Background())
	h.srv.push = q
	phone := h.token("home", "phone")
	h.must("POST", "/v1/register", phone, map[string]any{"push": map[string]string{"kind": "unifiedpush", "endpoint": fake.srv.URL + "/p"}}, http.StatusOK)
	h.register("home", "laptop")
	var list devicesResponse
	h.must("GET", "/v1/devices", phone, nil, http.StatusOK).json(t, &list)
	kinds := map[string]string{}
	for _, d := range list.Devices {
		kinds[d.Device] = d.PushKind
	}
	if kinds["phone"] != "unifiedpush" || kinds["laptop"] != "none" || len(kinds) != 2 {
		t.Errorf("push kinds %v", kinds)
	}
}

// TestPairedDeviceReachable: a device that pairs exists for the relay at
// once, even where the relay had just found it missing: a send to it
// before pairing is 404, right after 202, and it polls what was sent.
func TestPairedDeviceReachable(t *testing.T) {
	h, clk := newPairingHarness(t, nil)
	laptop := h.mint(token.Claims{Household: "home", Device: "laptop", IssuedAt: clk.now(), Expires: clk.now().Add(time.Hour)})
	h.must("POST", "/v1/register", laptop, nil, http.StatusOK)
	h.must("POST", "/v1/send", laptop, map[string]any{"id": "m0", "to": []string{"phone"}, "payload": []byte("x")}, http.StatusNotFound)
	c := h.pairWith(map[string]any{"code": h.invite(h.adminAt(clk.now()), "phone", "").Code}, http.StatusOK)
	h.send(laptop, "m1", []byte("hello"), "phone")
	if got := h.poll(c.AccessToken, "cursor=0&wait=0"); len(got.Envelopes) != 1 {
		t.Errorf("the paired phone polled %+v", got)
	}
}

// TestPairingStoresHashesOnly: the database files (SQLite's, its WAL
// included) hold the SHA-256 of each code and renewal secret and never
// the code or secret themselves.
func TestPairingStoresHashesOnly(t *testing.T) {
	dir := t.TempDir()
	h, clk := newPairingHarnessAt(t, filepath.Join(dir, "relay.db"))
	inv := h.invite(h.adminAt(clk.now()), "phone", "")
	c := h.pairWith(map[string]any{"code": inv.Code}, http.StatusOK)
	next := h.renewWith(c.RenewalSecret, http.StatusOK)
	var files []byte
	for _, name := range []string{"relay.db", "relay.db-wal"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		files = append(files, b...)
	}
	norm := strings.ReplaceAll(inv.Code, "-", "") // as the store hashes it
	for _, s := range []string{norm, c.RenewalSecret, next.RenewalSecret} {
		if bytes.Contains(files, []byte(s)) {
			t.Errorf("the database holds %q", s)
		}
		// A code is kept keyed: its plain hash, which one pass over every
		// code finds, is not in the database.
		if sum := sha256.Sum256([]byte(s)); bytes.Contains(files, sum[:]) != (s != norm) {
			t.Errorf("the database holding the SHA-256 of %q is %v", s, s == norm)
		}
	}
	if bytes.Contains(files, []byte(inv.Code)) || bytes.Contains(files, []byte(strings.ReplaceAll(inv.Code, "-", " "))) {
		t.Errorf("the database holds the code as shown")
	}
}
