package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
)

// elsewhere is a server on another origin that records what reaches it.
type elsewhere struct {
	*httptest.Server
	mu   sync.Mutex
	seen []string // one line per request
}

func newElsewhere(t *testing.T) *elsewhere {
	e := &elsewhere{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		e.seen = append(e.seen, fmt.Sprintf("%s %s Authorization=%q, %d bytes of body", r.Method, r.URL.Path, r.Header.Get("Authorization"), len(b)))
		e.mu.Unlock()
		// Answer as a relay would, so that a followed redirect succeeds.
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/send":
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, `{"id":"x","deliveries":[]}`)
		default:
			io.WriteString(w, `{"cursor":0,"more":false,"envelopes":[]}`)
		}
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *elsewhere) requests() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.seen...)
}

// redirector answers every request with a 307 to the same path and query
// at target, counting the requests.
func redirector(target string, hits *int, mu *sync.Mutex) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		*hits++
		mu.Unlock()
		http.Redirect(w, r, target+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	})
}

// TestNoTokenToAnotherOrigin: a relay (or something in front of it) that
// redirects to another port, or from https to http, never gets the client
// to send the token or the body there, whichever HTTP client the Client
// uses: the redirect is refused with a *RedirectError naming it, and Send
// and Listen do not retry it. Two real servers on loopback sockets; the
// second must receive nothing.
func TestNoTokenToAnotherOrigin(t *testing.T) {
	const tok = "secret-token"
	cases := []struct {
		name string
		tls  bool
		opts func(first *httptest.Server) []client.Option
	}{
		{"another port", false, func(*httptest.Server) []client.Option { return nil }},
		{"another port, own HTTP client", false, func(*httptest.Server) []client.Option {
			return []client.Option{client.WithHTTPClient(&http.Client{})}
		}},
		{"another port, HTTP client that follows anything", false, func(*httptest.Server) []client.Option {
			follow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}
			return []client.Option{client.WithHTTPClient(follow)}
		}},
		{"https to http", true, func(first *httptest.Server) []client.Option {
			return []client.Option{client.WithHTTPClient(first.Client())}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			second := newElsewhere(t)
			var hits int
			var mu sync.Mutex
			h := redirector(second.URL, &hits, &mu)
			first := httptest.NewUnstartedServer(h)
			if tc.tls {
				first.StartTLS()
			} else {
				first.Start()
			}
			defer first.Close()
			c := newClient(t, first.URL, tok, tc.opts(first)...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			refused := func(what string, err error) {
				t.Helper()
				if got := second.requests(); len(got) != 0 {
					t.Fatalf("%s: the other origin received %q", what, got)
				}
				var re *client.RedirectError
				if !errors.As(err, &re) || !strings.HasPrefix(re.To, second.URL+"/v1/") || !strings.HasPrefix(re.From, first.URL+"/v1/") {
					t.Fatalf("%s: %v, want a *RedirectError from %s to %s", what, err, first.URL, second.URL)
				}
			}
			_, err := c.SendOnce(ctx, "id-1", []string{"phone"}, []byte("private"))
			refused("SendOnce", err)
			_, err = c.Poll(ctx, client.PollQuery{Cursor: 0})
			refused("Poll", err)
			// Not retried: one more request each.
			_, err = c.Send(ctx, "id-2", []string{"phone"}, []byte("private"))
			refused("Send", err)
			refused("Listen", c.Listen(ctx, &client.MemoryCursor{}, func(context.Context, client.Envelope) error { return nil }))

			mu.Lock()
			defer mu.Unlock()
			if hits != 4 {
				t.Fatalf("the relay's origin got %d requests, want 4 (a refused redirect was retried)", hits)
			}
		})
	}
}

// TestSameOriginRedirectFollowed: a redirect within the relay's origin is
// still followed, token and all.
func TestSameOriginRedirectFollowed(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("/v1/poll", http.RedirectHandler("/moved/poll", http.StatusTemporaryRedirect))
	auth := make(chan string, 1)
	mux.HandleFunc("/moved/poll", func(w http.ResponseWriter, r *http.Request) {
		auth <- r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"cursor":7,"more":false,"envelopes":[]}`)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := newClient(t, srv.URL, "tok")
	res, err := c.Poll(context.Background(), client.PollQuery{Cursor: 7})
	if err != nil || res.Cursor != 7 {
		t.Fatalf("Poll: %+v, %v", res, err)
	}
	if a := <-auth; a != "Bearer tok" {
		t.Fatalf("Authorization after the redirect: %q", a)
	}
}

// TestWithHTTPClientUnchanged: the caller's HTTP client keeps its own
// CheckRedirect.
func TestWithHTTPClientUnchanged(t *testing.T) {
	hc := &http.Client{}
	newClient(t, "http://127.0.0.1:1", "tok", client.WithHTTPClient(hc))
	if hc.CheckRedirect != nil {
		t.Fatal("New changed the caller's http.Client")
	}
}
