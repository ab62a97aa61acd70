package client

import (
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// RedirectError is a redirect the client refused to follow because it
// leads to another origin (scheme, host or port) than the relay's: the
// request, token and body, is never sent there. net/http on its own drops
// Authorization only for another host name, so a redirect to another port,
// or from https to http on the same host, would carry the token, and the
// body with it. Retrying does not help: Send and Listen return it at once.
type RedirectError struct {
	From, To string // the URLs redirected from and to
}

func (e *RedirectError) Error() string {
	return "client: refusing a redirect from " + e.From + " to " + e.To + ", another origin than the relay's"
}

// sameOriginOnly returns a CheckRedirect that refuses a redirect leaving the
// first request's origin and leaves the rest to next (net/http's default,
// at most 10 redirects, when nil).
func sameOriginOnly(next func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		first := via[0].URL
		if origin(req.URL) != origin(first) {
			return &RedirectError{From: via[len(via)-1].URL.Redacted(), To: req.URL.Redacted()}
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
}

// origin returns u's scheme, host and port, lower case, with the scheme's
// default port made explicit, so that http://Relay and http://relay:80 are
// one origin and http://relay:80 and https://relay:80 are two.
func origin(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		switch scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		}
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}
