package relay

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/pairing"
	"github.com/flamenet/relay/token"
)

// TestRenewalsUnderFlood: junk guesses from many addresses, faster than
// the relay-wide budget, and a web page's text/plain posts, run while
// devices renew from one of the flooding addresses (a household behind
// the same NAT as a hostile page): every renewal succeeds. The guesses
// drain the shared budget (a guess from a new address is 429 pair_rate),
// and the page's posts are 415 before any budget is spent.
func TestRenewalsUnderFlood(t *testing.T) {
	h, clk := newPairingHarness(t, func(c *Config) {
		c.PairRatePerAddress, c.PairRate = 5, 20
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	})
	const devices = 12
	secrets := make([]string, devices)
	for i := range secrets {
		inv := h.invite(h.adminAt(clk.now()), fmt.Sprintf("d%d", i), "")
		// Pairing is a guess's kind of attempt: from its own address, so
		// that the setting up spends none of what the test floods.
		secrets[i] = h.pairWithHeader(map[string]any{"code": inv.Code}, http.StatusOK, "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i)).RenewalSecret
	}
	xff := func(i int) string { return fmt.Sprintf("2001:db8::%x", i%64) }

	var (
		stop             = make(chan struct{})
		wg               sync.WaitGroup
		guesses, limited atomic.Int64
		pageAnswers      sync.Map // status -> true
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i += 8 {
				select {
				case <-stop:
					return
				default:
				}
				body := map[string]any{"renewal_secret": pairing.NewRenewalSecret()}
				if i%3 == 0 {
					body = map[string]any{"code": "00000-00000"}
				}
				path := map[bool]string{true: "/v1/pair", false: "/v1/renew"}[i%3 == 0]
				r, err := h.do(t.Context(), "POST", path, "", body, "X-Forwarded-For", xff(i))
				if err != nil {
					return
				}
				guesses.Add(1)
				if r.status == http.StatusTooManyRequests {
					limited.Add(1)
				}
				// The page: a no-cors text/plain post from another origin.
				r, err = h.do(t.Context(), "POST", "/v1/pair", "", `{"code":"00000-00000"}`,
					"X-Forwarded-For", xff(i), "Content-Type", "text/plain;charset=UTF-8", "Origin", "https://hostile.example")
				if err != nil {
					return
				}
				pageAnswers.Store(r.status, true)
			}
		}()
	}
	eventually(t, "the flood to drain the relay-wide budget", func() bool { return limited.Load() > 0 })

	renewed, refused := 0, map[int]int{}
	for round := range 3 {
		for i := range secrets {
			r := h.try("POST", "/v1/renew", "", map[string]any{"renewal_secret": secrets[i]}, "X-Forwarded-For", xff(i))
			if r.status != http.StatusOK {
				refused[r.status]++
				t.Errorf("round %d, device %d: renewal %d %s", round, i, r.status, r.body)
				continue
			}
			var c pairing.CredentialsResponse
			r.json(t, &c)
			secrets[i] = c.RenewalSecret
			renewed++
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("renewals: %d attempted, %d succeeded, refused %v; %d guesses, %d of them 429", 3*devices, renewed, refused, guesses.Load(), limited.Load())

	fresh := h.must("POST", "/v1/pair", "", map[string]any{"code": "00000-00000"}, http.StatusTooManyRequests, "X-Forwarded-For", "203.0.113.9")
	if code := fresh.errCode(t); code != codeRateLimited {
		t.Errorf("a guess from a new address during the flood: %s", fresh.body)
	}
	pageAnswers.Range(func(k, _ any) bool {
		if k.(int) != http.StatusUnsupportedMediaType {
			t.Errorf("a page's text/plain post was answered %v, want 415 only", k)
		}
		return true
	})
}

// TestRenewalSecretBudget: a secret the relay issued has a budget of its
// own, six a minute: the seventh presentation within the minute is 429
// renewal_secret_rate, whatever the other six were answered.
func TestRenewalSecretBudget(t *testing.T) {
	h, clk := newPairingHarness(t, func(c *Config) { c.PairRatePerAddress = 1000 })
	c := h.pairWith(map[string]any{"code": h.invite(h.adminAt(clk.now()), "phone", "").Code}, http.StatusOK)
	for range 6 {
		if r := h.try("POST", "/v1/renew", "", map[string]any{"renewal_secret": c.RenewalSecret}); r.status == http.StatusTooManyRequests {
			t.Fatalf("a presentation within the budget: %s", r.body)
		}
	}
	r := h.must("POST", "/v1/renew", "", map[string]any{"renewal_secret": c.RenewalSecret}, http.StatusTooManyRequests)
	var e errorBody
	r.json(t, &e)
	if e.Limit != pairing.LimitSecret {
		t.Errorf("the seventh: %s, want limit %s", r.body, pairing.LimitSecret)
	}
	clk.advance(10 * time.Second)
	h.must("POST", "/v1/renew", "", map[string]any{"renewal_secret": c.RenewalSecret}, http.StatusUnauthorized)
}

// TestPairingOrigins: pair and renew take a browser's request only from
// the relay's own origin or one FN_CORS_ORIGINS lists exactly ("*" lists
// none); requests without an Origin are no browser's.
func TestPairingOrigins(t *testing.T) {
	for _, tc := range []struct {
		allowed []string
		origin  string
		want    int
	}{
		{nil, "", http.StatusUnauthorized},
		{nil, "https://elsewhere.example", http.StatusForbidden},
		{[]string{"https://app.example"}, "https://app.example", http.StatusUnauthorized},
		{[]string{"https://app.example"}, "https://app.example.evil", http.StatusForbidden},
		{[]string{"*"}, "https://elsewhere.example", http.StatusForbidden},
		{nil, "null", http.StatusForbidden},
	} {
		h, _ := newPairingHarness(t, func(c *Config) { c.PairRatePerAddress, c.CORSOrigins = 1000, tc.allowed })
		var header []string
		if tc.origin != "" {
			header = []string{"Origin", tc.origin}
		}
		for _, path := range []string{"/v1/pair", "/v1/renew"} {
			body := map[string]any{"code": "00000-00000", "renewal_secret": pairing.NewRenewalSecret()}
			if r := h.try("POST", path, "", body, header...); r.status != tc.want {
				t.Errorf("%s from %q with FN_CORS_ORIGINS %v: %d %s, want %d", path, tc.origin, tc.allowed, r.status, r.body, tc.want)
			}
		}
		// The relay's own pages (the console) pair.
		own := "http://" + strings.TrimPrefix(h.url, "http://")
		if r := h.try("POST", "/v1/pair", "", map[string]any{"code": "00000-00000"}, "Origin", own); r.status != http.StatusUnauthorized {
			t.Errorf("from the relay's own origin: %d %s", r.status, r.body)
		}
	}
}

// TestPairingContentTypes: pair and renew take JSON and MessagePack
// bodies only; anything else, or none, is 415 before any budget is spent.
func TestPairingContentTypes(t *testing.T) {
	h, _ := newPairingHarness(t, func(c *Config) { c.PairRatePerAddress = 1 })
	for _, ct := range []string{"text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "application/jsonx"} {
		for _, path := range []string{"/v1/pair", "/v1/renew"} {
			r := h.must("POST", path, "", `{"code":"00000-00000"}`, http.StatusUnsupportedMediaType, "Content-Type", ct)
			if code := r.errCode(t); code != codeUnsupportedType {
				t.Errorf("%s as %q: %s", path, ct, r.body)
			}
		}
	}
	// The one attempt the address may make is still there.
	h.must("POST", "/v1/pair", "", `{"code":"00000-00000"}`, http.StatusUnauthorized, "Content-Type", "application/json; charset=utf-8")
}

// TestTokenAfterRemovalSameSecond: a device removed and paired again
// within one second, or replaced by a pairing, gets a token the relay
// accepts: iat is to the microsecond and after the removal.
func TestTokenAfterRemovalSameSecond(t *testing.T) {
	h, clk := newPairingHarness(t, nil)
	clk.set(time.Date(2026, 12, 4, 12, 0, 0, 100_000_000, time.UTC))
	admin := h.adminAt(clk.now().Add(-time.Minute))
	h.pairWith(map[string]any{"code": h.invite(admin, "phone", "").Code}, http.StatusOK)
	clk.advance(time.Millisecond)
	h.must("DELETE", "/v1/devices/phone", admin, nil, http.StatusNoContent)
	clk.advance(time.Millisecond) // the same second
	again := h.pairWith(map[string]any{"code": h.invite(admin, "phone", "").Code}, http.StatusOK)
	h.must("POST", "/v1/register", again.AccessToken, nil, http.StatusOK)
	renewed := h.renewWith(again.RenewalSecret, http.StatusOK)
	h.must("POST", "/v1/register", renewed.AccessToken, nil, http.StatusOK)

	// Replaced, in the same microsecond as the invitation's redemption.
	replaced := h.pairWith(map[string]any{"code": h.inviteReplacing(admin, "phone").Code}, http.StatusOK)
	h.must("POST", "/v1/register", replaced.AccessToken, nil, http.StatusOK)
	h.must("POST", "/v1/register", renewed.AccessToken, nil, http.StatusUnauthorized)
	claims, err := token.Verify(replaced.AccessToken, h.srv.keys, clk.now())
	if err != nil || claims.IssuedAt.Truncate(time.Second).Equal(claims.IssuedAt) {
		t.Errorf("the replacement's token: %+v, %v; want iat with its microseconds", claims, err)
	}
}

// TestReplaceDevice: an invitation for a name in use is 409 unless it
// replaces the device; redeeming one that does is a removal, then a new
// life: the old device's held poll ends 401, its token and renewal secret
// are refused, its envelopes are gone, and the directory gives the new
// device's key, so that peers pinning the old one are warned.
func TestReplaceDevice(t *testing.T) {
	h, clk := newPairingHarness(t, func(c *Config) { c.PairRatePerAddress = 1000 })
	admin := h.adminAt(clk.now())
	oldKey, _, _ := ed25519.GenerateKey(nil)
	newKey, _, _ := ed25519.GenerateKey(nil)
	old := h.pairWith(map[string]any{"code": h.invite(admin, "phone", "").Code, "identity_key": []byte(oldKey)}, http.StatusOK)
	h.must("POST", "/v1/register", old.AccessToken, nil, http.StatusOK)
	laptop := h.register("home", "laptop")
	h.send(laptop, "a", []byte("for the old phone"), "phone")

	if r := h.must("POST", "/v1/invitations", admin, map[string]any{"device": "phone"}, http.StatusConflict); r.errCode(t) != codeDeviceExists {
		t.Errorf("an invitation for a device in use: %s", r.body)
	}

	held := make(chan reply, 1)
	go func() { held <- h.try("GET", "/v1/poll?cursor=1&wait=20", old.AccessToken, nil) }()
	eventually(t, "the old phone's poll held", func() bool { return h.srv.HeldPolls() == 1 })

	clk.advance(time.Second)
	inv := h.inviteReplacing(admin, "phone")
	if !inv.Replace {
		t.Errorf("invitation %+v does not say it replaces", inv)
	}
	fresh := h.pairWith(map[string]any{"code": inv.Code, "identity_key": []byte(newKey)}, http.StatusOK)
	select {
	case r := <-held:
		if r.status != http.StatusUnauthorized {
			t.Errorf("the old phone's held poll: %d %s, want 401", r.status, r.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the old phone's held poll did not end when it was replaced")
	}
	h.must("POST", "/v1/register", old.AccessToken, nil, http.StatusUnauthorized)
	h.renewWith(old.RenewalSecret, http.StatusUnauthorized)

	if p := h.poll(fresh.AccessToken, "cursor=0&wait=0"); len(p.Envelopes) != 0 {
		t.Errorf("the new phone was handed the old one's envelopes: %+v", p.Envelopes)
	}
	h.send(laptop, "b", []byte("for the new phone"), "phone")
	if p := h.poll(fresh.AccessToken, "cursor=0&wait=0"); len(p.Envelopes) != 1 || p.Envelopes[0].Seq != 1 {
		t.Errorf("the new phone's first poll: %+v, want the new envelope at seq 1", p)
	}
	var list devicesResponse
	h.must("GET", "/v1/devices", laptop, nil, http.StatusOK).json(t, &list)
	for _, d := range list.Devices {
		if d.Device == "phone" && !bytes.Equal(d.IdentityKey, newKey) {
			t.Errorf("the directory gives phone's key as %x, want the new device's %x", d.IdentityKey, []byte(newKey))
		}
	}
}

// TestCancelInvitation: an admin cancels a pending invitation, whose code
// then no longer pairs; cancelling again is 404.
func TestCancelInvitation(t *testing.T) {
	h, clk := newPairingHarness(t, func(c *Config) { c.PairRatePerAddress = 1000 })
	admin := h.adminAt(clk.now())
	inv := h.invite(admin, "phone", "")
	h.must("DELETE", "/v1/invitations/phone", admin, nil, http.StatusNoContent)
	h.pairWith(map[string]any{"code": inv.Code}, http.StatusUnauthorized)
	h.must("DELETE", "/v1/invitations/phone", admin, nil, http.StatusNotFound)
	var list pairing.InvitationsResponse
	h.must("GET", "/v1/invitations", admin, nil, http.StatusOK).json(t, &list)
	if len(list.Invitations) != 0 {
		t.Errorf("invitations after the cancel: %+v", list.Invitations)
	}
}
