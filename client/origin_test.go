package client

import (
	"net/url"
	"testing"
)

// TestOrigin: scheme, host and port, with the default port made explicit.
func TestOrigin(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"http://relay/v1/send", "http://RELAY:80/other", true},
		{"https://relay/v1/send", "https://relay:443/v1/send", true},
		{"https://relay/v1/send", "http://relay:443/v1/send", false},
		{"https://relay:8443/v1/send", "http://relay:8443/v1/send", false},
		{"http://127.0.0.1:18230/v1/send", "http://127.0.0.1:18231/v1/send", false},
		{"http://relay/v1/send", "http://relay.evil/v1/send", false},
		{"http://[::1]:80/v1/send", "http://[::1]/v1/send", true},
	} {
		a, _ := url.Parse(tc.a)
		b, _ := url.Parse(tc.b)
		if got := origin(a) == origin(b); got != tc.same {
			t.Errorf("%s and %s: same origin %v, want %v (%s, %s)", tc.a, tc.b, got, tc.same, origin(a), origin(b))
		}
	}
}
