// Package cors lets web apps served from other origins call the API
// (FN_CORS_ORIGINS).
package cors

import (
	"net/http"
	"slices"
	"strings"

	"github.com/go-chi/chi/v5"
)

// The API authenticates with bearer tokens that a page sets itself, never
// with cookies, so the browser sends nothing on a page's behalf that the page
// does not already hold: allowing an origin, or any ("*"), only lets its
// pages read the answers to requests they make with their own tokens.

const (
	corsAllowHeaders  = "Authorization, Content-Type, Accept"
	corsExposeHeaders = "Retry-After, WWW-Authenticate"
	// Chromium caches a preflight for at most two hours, Firefox a day; the
	// cache is per URL, so a poll with a new cursor is preflighted anew.
	corsMaxAge = "7200"
)

// corsMethods are the methods a preflight may be answered with, in the
// order Access-Control-Allow-Methods lists them.
var corsMethods = []string{http.MethodGet, http.MethodPost, http.MethodDelete}

// origins is the parsed FN_CORS_ORIGINS: nothing (off), any, or a list of
// exact origins.
type origins struct {
	any  bool
	list []string
}

func (o origins) allows(origin string) bool {
	return origin != "" && (o.any || slices.Contains(o.list, origin))
}

// Handler adds the CORS headers to the API's answers (paths under /v1/)
// for the allowed origins (FN_CORS_ORIGINS: exact origins, or "*" alone for
// any; none: next itself), error answers included so that a page can read
// a 401's or a 429's status, body and Retry-After, and answers their
// preflights with the methods router serves on the path. Requests from
// other origins, and preflights from them, pass through untouched: a
// preflight then gets the router's 405 without any CORS header, and the
// browser refuses the request.
//
// refused, if not nil, is told of each request from another origin that
// is not allowed (a browser will withhold the answer from its page); a
// request whose Origin is the relay's own (same-origin requests carry one
// too) is not a refusal.
func Handler(allowed []string, router chi.Router, refused func(origin string), next http.Handler) http.Handler {
	o := origins{list: allowed}
	if slices.Equal(allowed, []string{"*"}) {
		o = origins{any: true}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		if len(allowed) > 0 && !o.any {
			// The answer depends on the Origin: caches must not mix them.
			h.Add("Vary", "Origin")
		}
		origin := r.Header.Get("Origin")
		if !o.allows(origin) {
			if origin != "" && refused != nil && !SameOrigin(origin, r.Host) {
				refused(origin)
			}
			next.ServeHTTP(w, r)
			return
		}
		if o.any {
			h.Set("Access-Control-Allow-Origin", "*")
		} else {
			h.Set("Access-Control-Allow-Origin", origin)
		}
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			var methods []string
			for _, m := range corsMethods {
				if router.Match(chi.NewRouteContext(), m, r.URL.Path) {
					methods = append(methods, m)
				}
			}
			if len(methods) > 0 {
				h.Set("Access-Control-Allow-Methods", strings.Join(methods, ", "))
				h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
				h.Set("Access-Control-Max-Age", corsMaxAge)
				w.WriteHeader(http.StatusNoContent)
				return
			}
			// No such route: the router's 404, readable by the page.
		}
		h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
		next.ServeHTTP(w, r)
	})
}

// SameOrigin reports whether origin names the host the request was sent to
// (the scheme is not compared: behind a TLS proxy the relay sees HTTP).
func SameOrigin(origin, host string) bool {
	_, rest, ok := strings.Cut(origin, "://")
	return ok && strings.EqualFold(rest, host)
}
