package relay

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	qrcode "github.com/skip2/go-qrcode"

	"github.com/flamenet/relay/console"
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

	h.shutdown()
	for _, c := range []string{inv.Code, strings.ReplaceAll(inv.Code, "-", "")} {
		if strings.Contains(log.String(), c) {
			t.Errorf("the log holds the code %s:\n%s", c, log.String())
		}
	}
	if !strings.Contains(log.String(), `"route":"/console/qr"`) {
		t.Errorf("no access line of the QR requests:\n%s", log.String())
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
