package relay

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	qrcode "github.com/skip2/go-qrcode"

	"github.com/flamenet/relay/internal/console"
	"github.com/flamenet/relay/internal/pairing"
	"github.com/flamenet/relay/token"
)

// TestConsoleOff: without Config.Console nothing is served under
// /console, and the QR endpoint does not exist.
func TestConsoleOff(t *testing.T) {
	h, clk := newPairingHarness(t, nil)
	for _, p := range []string{"/console", "/console/", "/console/console.js"} {
		if r := h.must("GET", p, "", nil, http.StatusNotFound); r.errCode(t) != codeNotFound {
			t.Errorf("GET %s: %s", p, r.body)
		}
	}
	h.must("POST", "/console/qr", h.adminAt(clk.now()), map[string]any{"code": "ABCDE-FGHJK"}, http.StatusNotFound)
}

// TestConsoleFiles: the console's files are served with their types and
// the strict headers (a policy without inline script, no framing, no
// referrer), /console sends to /console/, and a path that is no file is a
// 404 with the same headers.
func TestConsoleFiles(t *testing.T) {
	h, _ := newPairingHarness(t, func(c *Config) { c.Console = true })
	strict := func(p string, r reply) {
		t.Helper()
		for k, v := range map[string]string{
			"Content-Security-Policy": console.Policy,
			"X-Frame-Options":         "DENY",
			"Referrer-Policy":         "no-referrer",
			"X-Content-Type-Options":  "nosniff",
		} {
			if got := r.header.Get(k); got != v {
				t.Errorf("%s: %s %q, want %q", p, k, got, v)
			}
		}
	}
	for p, ct := range map[string]string{
		"/console/":                  "text/html; charset=utf-8",
		"/console/index.html":        "text/html; charset=utf-8",
		"/console/console.js":        "text/javascript; charset=utf-8",
		"/console/console.css":       "text/css; charset=utf-8",
		"/console/client/client.js":  "text/javascript; charset=utf-8",
		"/console/client/base64.js":  "text/javascript; charset=utf-8",
		"/console/client/errors.js":  "text/javascript; charset=utf-8",
		"/console/client/cursor.js":  "text/javascript; charset=utf-8",
		"/console/client/backoff.js": "text/javascript; charset=utf-8",
	} {
		r := h.must("GET", p, "", nil, http.StatusOK)
		strict(p, r)
		if got := r.header.Get("Content-Type"); got != ct || len(r.body) == 0 {
			t.Errorf("%s: Content-Type %q (want %q), %d bytes", p, got, ct, len(r.body))
		}
		// Revalidated with its ETag: an unchanged file is a 304.
		if r.header.Get("Cache-Control") != "no-cache" || r.header.Get("ETag") == "" {
			t.Errorf("%s: Cache-Control %q, ETag %q", p, r.header.Get("Cache-Control"), r.header.Get("ETag"))
		}
		h.must("GET", p, "", nil, http.StatusNotModified, "If-None-Match", r.header.Get("ETag"))
	}
	page := h.must("GET", "/console/", "", nil, http.StatusOK)
	// The policy forbids inline script: the page has none.
	if bytes.Contains(page.body, []byte("<script>")) || !bytes.Contains(page.body, []byte(`<script type="module" src="console.js"></script>`)) {
		t.Errorf("the page's scripts:\n%s", page.body)
	}

	noRedirect := *h.client
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := noRedirect.Get(h.url + "/console")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/console/" {
		t.Errorf("GET /console: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}

	for _, p := range []string{"/console/nothing.js", "/console/client/seal.js", "/console/../v1/devices"} {
		r := h.must("GET", p, "", nil, http.StatusNotFound)
		strict(p, r)
	}
	h.must("POST", "/console/", "", nil, http.StatusMethodNotAllowed)
}

// TestConsoleQR: an admin token gets the QR code, in SVG, of the pairing
// link of the code it sends, the same link POST /v1/invitations answers;
// other tokens, no token and bad bodies are refused with the protocol's
// errors, and the code is in no log line.
func TestConsoleQR(t *testing.T) {
	h, clk, log := newPairingHarnessIn(t, t.TempDir()+"/relay.db", func(c *Config) { c.Console = true })
	admin := h.adminAt(clk.now())
	inv := h.invite(admin, "phone", "")

	for _, code := range []string{inv.Code, strings.ToLower(strings.ReplaceAll(inv.Code, "-", ""))} {
		r := h.must("POST", "/console/qr", admin, map[string]any{"code": code}, http.StatusOK)
		if r.header.Get("Content-Type") != "image/svg+xml" || r.header.Get("Cache-Control") != "no-store" ||
			r.header.Get("Content-Security-Policy") != console.Policy {
			t.Errorf("QR answer's headers: %v", r.header)
		}
		q, err := qrcode.New(inv.URL, qrcode.Medium)
		if err != nil {
			t.Fatal(err)
		}
		want, err := console.QR(inv.URL)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r.body, want) || !bytes.HasPrefix(r.body, []byte("<svg ")) {
			t.Errorf("the QR code of %q is not the link's %q:\n%s", code, inv.URL, r.body)
		}
		if n := len(q.Bitmap()); !bytes.Contains(r.body, []byte(`viewBox="0 0 `+strconv.Itoa(n)+" "+strconv.Itoa(n)+`"`)) {
			t.Errorf("the QR code is not %d modules wide: %.100s", n, r.body)
		}
	}

	device := h.mint(token.Claims{Household: "home", Device: "laptop", IssuedAt: clk.now(), Expires: clk.now().Add(time.Hour)})
	if r := h.must("POST", "/console/qr", device, map[string]any{"code": inv.Code}, http.StatusForbidden); r.errCode(t) != codeForbidden {
		t.Errorf("a device token: %s", r.body)
	}
	if r := h.must("POST", "/console/qr", "", map[string]any{"code": inv.Code}, http.StatusUnauthorized); r.errCode(t) != codeUnauthorized {
		t.Errorf("no token: %s", r.body)
	}
	for _, body := range []any{map[string]any{"code": "ABCDE"}, map[string]any{"code": "https://evil.example/"}, `{"code":`, `{"code":7}`, nil} {
		if r := h.must("POST", "/console/qr", admin, body, http.StatusBadRequest); r.errCode(t) != codeBadRequest {
			t.Errorf("body %v: %s", body, r.body)
		}
	}
	if r := h.must("POST", "/console/qr", admin, `{"code":"`+strings.Repeat("A", 2000)+`"}`, http.StatusRequestEntityTooLarge); r.errCode(t) == "" {
		t.Errorf("a large body: %s", r.body)
	}
	h.must("GET", "/console/qr", admin, nil, http.StatusNotFound)

	// The link drawn is the one of the invitation's scope, which the
	// console sends: an admin's opens the console, an app device's the
	// pairing page (the default: that page never spends a code).
	adm := h.invite(admin, "tablet", "admin")
	for _, tc := range []struct {
		body map[string]any
		url  string
	}{
		{map[string]any{"code": adm.Code, "scope": "admin"}, adm.URL},
		{map[string]any{"code": inv.Code, "scope": "device"}, inv.URL},
	} {
		want, err := console.QR(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		if r := h.must("POST", "/console/qr", admin, tc.body, http.StatusOK); !bytes.Equal(r.body, want) {
			t.Errorf("the QR code of %v is not the link %q", tc.body, tc.url)
		}
	}
	if r := h.must("POST", "/console/qr", admin, map[string]any{"code": inv.Code, "scope": "root"}, http.StatusBadRequest); r.errCode(t) != codeBadRequest {
		t.Errorf("a bad scope: %s", r.body)
	}

	h.shutdown()
	for _, c := range []string{inv.Code, strings.ReplaceAll(inv.Code, "-", ""), adm.Code} {
		if strings.Contains(log.String(), c) {
			t.Errorf("the log holds the code %s:\n%s", c, log.String())
		}
	}
	if !strings.Contains(log.String(), `"route":"/console/qr"`) {
		t.Errorf("no access line of the QR requests:\n%s", log.String())
	}
}

// TestPairPage: an app device's invitation link opens the pairing page,
// which the relay serves whenever it pairs, the console off (as here) or
// on, with the console's strict headers. The page shows the code and
// hands it to the app; it never redeems it: neither the page nor its
// script talks to the relay at all. A relay that does not pair serves no
// such page, and the console's files and the page's are each under their
// own path only.
func TestPairPage(t *testing.T) {
	h, clk := newPairingHarness(t, nil)
	inv := h.invite(h.adminAt(clk.now()), "phone", "")
	page, frag, _ := strings.Cut(inv.URL, "#")
	if page != h.url+"/pair/" || frag != "code="+inv.Code+"&household=home" {
		t.Fatalf("an app device's link: %q", inv.URL)
	}
	var all []byte
	for p, ct := range map[string]string{
		"/pair/":            "text/html; charset=utf-8",
		"/pair/pair.js":     "text/javascript; charset=utf-8",
		"/pair/pair.css":    "text/css; charset=utf-8",
		"/pair/favicon.svg": "image/svg+xml",
	} {
		r := h.must("GET", p, "", nil, http.StatusOK)
		if r.header.Get("Content-Type") != ct || r.header.Get("Content-Security-Policy") != console.Policy ||
			r.header.Get("Referrer-Policy") != "no-referrer" || r.header.Get("X-Frame-Options") != "DENY" || len(r.body) == 0 {
			t.Errorf("GET %s: %v, %d bytes", p, r.header, len(r.body))
		}
		all = append(all, r.body...)
	}
	html := h.must("GET", "/pair/", "", nil, http.StatusOK).body
	if bytes.Contains(html, []byte("<script>")) || !bytes.Contains(html, []byte(`<script type="module" src="pair.js"></script>`)) {
		t.Errorf("the page's scripts:\n%s", html)
	}
	for _, call := range []string{"fetch(", "XMLHttpRequest", "sendBeacon", "EventSource", "WebSocket", "<form", "/v1/", "import "} {
		if bytes.Contains(all, []byte(call)) {
			t.Errorf("the pairing page holds %q: it must never talk to the relay", call)
		}
	}
	if !bytes.Contains(all, []byte(`"flamenet-relay"`)) {
		t.Error("the pairing page does not hand the code to the app (the flamenet-relay scheme)")
	}
	noRedirect := *h.client
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := noRedirect.Get(h.url + "/pair")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/pair/" {
		t.Errorf("GET /pair: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, p := range []string{"/pair/console.js", "/pair/client/client.js", "/pair/nothing.js", "/console/"} {
		if r := h.must("GET", p, "", nil, http.StatusNotFound); r.errCode(t) != codeNotFound {
			t.Errorf("GET %s: %s", p, r.body)
		}
	}
	// The invitation is still pending: nothing above redeemed it.
	var ins pairing.InvitationsResponse
	h.must("GET", "/v1/invitations", h.adminAt(clk.now()), nil, http.StatusOK).json(t, &ins)
	if len(ins.Invitations) != 1 || ins.Invitations[0].RedeemedAt != nil {
		t.Errorf("invitations: %+v", ins.Invitations)
	}

	withConsole, _ := newPairingHarness(t, func(c *Config) { c.Console = true })
	withConsole.must("GET", "/pair/", "", nil, http.StatusOK)
	withConsole.must("GET", "/console/pair/index.html", "", nil, http.StatusNotFound)
	withConsole.must("GET", "/console/pair/pair.js", "", nil, http.StatusNotFound)

	off := newHarness(t, func(c *Config) { c.IssuerKey = nil })
	if r := off.must("GET", "/pair/", "", nil, http.StatusNotFound); r.errCode(t) != codeNotFound {
		t.Errorf("a relay that does not pair: %s", r.body)
	}
}

// TestConsoleNeedsPairing: a relay whose tokens come from elsewhere
// cannot serve the console, which pairs the browser.
func TestConsoleNeedsPairing(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Console = true
	h := newHarness(t, nil)
	cfg.IssuerKeys = h.srv.cfg.IssuerKeys
	if _, err := New(cfg, Deps{Store: h.srv.store, Hub: h.hub}); err == nil || !strings.Contains(err.Error(), "console") {
		t.Errorf("New with the console and no issuer key: %v", err)
	}
}
