package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/flamenet/relay/internal/servicetest"
)

const (
	appOrigin   = "https://app.example"
	otherOrigin = "https://evil.example"
)

// preflight asks as a browser does before a cross-origin request with an
// Authorization header.
func (h *harness) preflight(path, origin, method string) reply {
	h.t.Helper()
	r, err := h.do(context.Background(), http.MethodOptions, path, "", nil,
		"Origin", origin, "Access-Control-Request-Method", method,
		"Access-Control-Request-Headers", "authorization,content-type")
	if err != nil {
		h.t.Fatalf("OPTIONS %s: %v", path, err)
	}
	return r
}

// corsHeaders are the answer's Access-Control-* headers.
func corsHeaders(r reply) []string {
	var out []string
	for k := range r.header {
		if strings.HasPrefix(k, "Access-Control-") {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func headerList(r reply, name string) []string {
	var out []string
	for _, v := range r.header.Values(name) {
		for part := range strings.SplitSeq(v, ",") {
			out = append(out, strings.ToLower(strings.TrimSpace(part)))
		}
	}
	return out
}

// TestCORSOff: with FN_CORS_ORIGINS empty (the default) no answer carries
// a CORS header and a preflight is the 405 of any other method.
func TestCORSOff(t *testing.T) {
	h := newHarness(t, nil)
	tok := h.register("home", "phone")
	if r := h.preflight("/v1/send", appOrigin, "POST"); r.status != http.StatusMethodNotAllowed || len(corsHeaders(r)) > 0 {
		t.Errorf("preflight without CORS: status %d, CORS headers %v; want 405 and none", r.status, corsHeaders(r))
	}
	r := h.must("GET", "/v1/poll", tok, nil, http.StatusOK, "Origin", appOrigin)
	if len(corsHeaders(r)) > 0 || r.header.Get("Vary") != "" {
		t.Errorf("poll without CORS carries %v, Vary %q", corsHeaders(r), r.header.Get("Vary"))
	}
}

// TestCORSListed: a listed origin's preflights are answered with the
// route's methods, and its answers, errors included, are readable with
// Retry-After and WWW-Authenticate; an origin not listed gets nothing.
func TestCORSListed(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.CORSOrigins = []string{"http://127.0.0.1:5173", appOrigin}
		c.SendBurst, c.SendRate = 2, 1e-9 // the third send is a 429
	})

	for path, want := range map[string]string{
		"/v1/send":          "POST",
		"/v1/register":      "POST",
		"/v1/ack":           "POST",
		"/v1/poll?cursor=3": "GET",
		"/v1/devices":       "GET",
		"/v1/devices/phone": "DELETE",
	} {
		r := h.preflight(path, appOrigin, want)
		if r.status != http.StatusNoContent || len(r.body) != 0 {
			t.Errorf("preflight %s: status %d body %q, want 204 and none", path, r.status, r.body)
		}
		if got := r.header.Get("Access-Control-Allow-Origin"); got != appOrigin {
			t.Errorf("preflight %s: Allow-Origin %q, want %q", path, got, appOrigin)
		}
		if got := r.header.Get("Access-Control-Allow-Methods"); got != want {
			t.Errorf("preflight %s: Allow-Methods %q, want %q", path, got, want)
		}
		allowed := headerList(r, "Access-Control-Allow-Headers")
		for _, need := range []string{"authorization", "content-type"} {
			if !slices.Contains(allowed, need) {
				t.Errorf("preflight %s: Allow-Headers %v lacks %s", path, allowed, need)
			}
		}
		if r.header.Get("Access-Control-Max-Age") == "" {
			t.Errorf("preflight %s: no Max-Age", path)
		}
		if !slices.Contains(headerList(r, "Vary"), "origin") {
			t.Errorf("preflight %s: Vary %v lacks Origin", path, r.header.Values("Vary"))
		}
	}

	// Not listed: no CORS header at all, and not a 2xx the browser could take.
	if r := h.preflight("/v1/send", otherOrigin, "POST"); r.status < 300 || len(corsHeaders(r)) > 0 {
		t.Errorf("preflight from an unlisted origin: status %d, CORS headers %v", r.status, corsHeaders(r))
	}
	if r := h.preflight("/v1/nowhere", appOrigin, "GET"); r.status != http.StatusNotFound {
		t.Errorf("preflight of an unknown path: status %d, want 404", r.status)
	}

	readable := func(what string, r reply, origin string) {
		t.Helper()
		if got := r.header.Get("Access-Control-Allow-Origin"); got != origin {
			t.Errorf("%s: Allow-Origin %q, want %q", what, got, origin)
		}
		exposed := headerList(r, "Access-Control-Expose-Headers")
		for _, need := range []string{"retry-after", "www-authenticate"} {
			if !slices.Contains(exposed, need) {
				t.Errorf("%s: Expose-Headers %v lacks %s", what, exposed, need)
			}
		}
		if !slices.Contains(headerList(r, "Vary"), "origin") {
			t.Errorf("%s: Vary %v lacks Origin", what, r.header.Values("Vary"))
		}
	}
	tok := h.token("home", "phone")
	readable("register", h.must("POST", "/v1/register", tok, nil, http.StatusOK, "Origin", appOrigin), appOrigin)
	send := func(id string) map[string]any {
		return map[string]any{"id": id, "to": []string{"phone"}, "payload": []byte("x")}
	}
	readable("send", h.must("POST", "/v1/send", tok, send("a"), http.StatusAccepted, "Origin", "http://127.0.0.1:5173"), "http://127.0.0.1:5173")
	readable("401", h.must("GET", "/v1/poll", "", nil, http.StatusUnauthorized, "Origin", appOrigin), appOrigin)
	h.must("POST", "/v1/send", tok, send("b"), http.StatusAccepted)
	r := h.must("POST", "/v1/send", tok, send("c"), http.StatusTooManyRequests, "Origin", appOrigin)
	readable("429", r, appOrigin)
	if r.header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	readable("404", h.must("GET", "/v1/nowhere", tok, nil, http.StatusNotFound, "Origin", appOrigin), appOrigin)

	if r := h.must("GET", "/v1/poll", tok, nil, http.StatusOK, "Origin", otherOrigin); len(corsHeaders(r)) > 0 {
		t.Errorf("poll from an unlisted origin carries %v", corsHeaders(r))
	}
	if r := h.must("GET", "/v1/poll", tok, nil, http.StatusOK); len(corsHeaders(r)) > 0 {
		t.Errorf("poll without Origin carries %v", corsHeaders(r))
	}
	// The probes are not part of the API a page calls.
	if r := h.must("GET", "/live", "", nil, http.StatusOK, "Origin", appOrigin); len(corsHeaders(r)) > 0 {
		t.Errorf("/live carries %v", corsHeaders(r))
	}
}

// TestCORSAny: "*" answers every origin with Allow-Origin: *, which
// browsers accept for requests without credentials (cookies), as the
// API's are.
func TestCORSAny(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.CORSOrigins = []string{"*"} })
	r := h.preflight("/v1/poll?cursor=0", otherOrigin, "GET")
	if r.status != http.StatusNoContent || r.header.Get("Access-Control-Allow-Origin") != "*" || r.header.Get("Access-Control-Allow-Methods") != "GET" {
		t.Errorf("preflight: status %d, headers %v", r.status, r.header)
	}
	tok := h.token("home", "phone")
	r = h.must("GET", "/v1/poll", tok, nil, http.StatusOK, "Origin", otherOrigin)
	if r.header.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("poll: Allow-Origin %q, want *", r.header.Get("Access-Control-Allow-Origin"))
	}
}

// TestCORSRefusalLogged: a request from an origin FN_CORS_ORIGINS does not
// allow (its page sees only "Failed to fetch") is logged with the origin
// and the setting, a line a minute at most however many come; a request
// from the relay's own origin, and one from an allowed origin, are not.
func TestCORSRefusalLogged(t *testing.T) {
	for _, allowed := range [][]string{nil, {appOrigin}} {
		t.Run(fmt.Sprint(allowed), func(t *testing.T) {
			h, log := accessHarness(t, func(c *Config) { c.CORSOrigins = allowed; c.AccessLog = false })
			tok := h.register("home", "phone")
			h.must("GET", "/v1/poll", tok, nil, http.StatusOK, "Origin", h.url) // same origin
			if len(allowed) > 0 {
				h.must("GET", "/v1/poll", tok, nil, http.StatusOK, "Origin", appOrigin)
			}
			if lines := refusalLines(t, log); len(lines) != 0 {
				t.Fatalf("logged as refused: %v", lines)
			}
			for range 5 {
				h.preflight("/v1/send", otherOrigin, "POST")
			}
			lines := refusalLines(t, log)
			if len(lines) != 1 {
				t.Fatalf("%d refusal lines for 5 refused preflights, want 1: %v", len(lines), lines)
			}
			if field(lines[0], "origin") != otherOrigin || !strings.Contains(field(lines[0], "msg"), "FN_CORS_ORIGINS") {
				t.Errorf("refusal line = %v", lines[0])
			}
		})
	}
}

func refusalLines(t *testing.T, log *servicetest.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(log.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if strings.HasPrefix(field(m, "msg"), "a request from another origin was refused") {
			out = append(out, m)
		}
	}
	return out
}
