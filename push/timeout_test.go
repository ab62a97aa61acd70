package push

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// trickle answers 201 at once, then its 1000-byte body a byte every 50 ms
// (50 s in all), like an endpoint that holds a worker by answering slowly.
func trickle(tb testing.TB, tls bool) *httptest.Server {
	tb.Helper()
	stop := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(http.StatusCreated)
		w.(http.Flusher).Flush()
		for range 1000 {
			select {
			case <-stop:
				return
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := w.Write([]byte("x")); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}))
	if tls {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	tb.Cleanup(srv.Close)
	tb.Cleanup(func() { close(stop) }) // runs first: lets the handler end
	return srv
}

// A push whose answer trickles in frees its worker at the attempt bound and
// is counted failed. Before the attempt bound (and with the answer's body
// read errors ignored), the worker was held for the whole 30 s deadline
// and the push was counted as sent (it ended after 30.0 s, sent). Dropping
// the attempt bound from caller.call (done once on purpose) turns this red:
// the wait for the push's end times out.
func TestTrickleFreesWorker(t *testing.T) {
	const attempt = 500 * time.Millisecond
	slow := trickle(t, false)
	healthy := newUPFake(t, nil)
	q := newQueue(t, Config{Workers: 1, AllowPrivate: true, Timeout: 30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Second, AttemptTimeout: attempt}, nil)

	start := time.Now()
	q.Enqueue(householdJob("A", "a", slow.URL+"/trickle"))
	waitFor(t, "the trickling push ended", func() bool { s := q.Stats(); return s.Sent+s.Failed == 1 })
	took := time.Since(start)
	if s := q.Stats(); s.Sent != 0 || s.Failed != 1 || s.Retried != 0 {
		t.Errorf("stats %+v; want the trickling push failed, not sent, not retried", s)
	}
	// The attempt bound plus slack for a loaded machine; the trickle
	// would take 50 s, the push's deadline is 30 s.
	if took > attempt+2*time.Second {
		t.Errorf("the trickling push held its worker %v, past the %v attempt bound", took, attempt)
	}

	// The one worker is free again.
	q.Enqueue(householdJob("B", "b", healthy.url("/b")))
	waitFor(t, "B's push sent", func() bool { return q.Stats().Sent == 1 })
	closeQueue(t, q)
}

// Every provider's exchange is bounded the same way: a trickling answer
// ends the push at the attempt bound, over HTTP/1.1 and HTTP/2. Without
// the bound (done once on purpose) each Push took the trickle's 51 s.
func TestProvidersBoundTheAttempt(t *testing.T) {
	const attempt = 300 * time.Millisecond
	_, keyFile := newP8(t)
	for _, tc := range []struct {
		name string
		push func(t *testing.T) error
	}{
		{"unifiedpush", func(t *testing.T) error {
			srv := trickle(t, false)
			p := newUnifiedPush(withDefaults(Config{AllowPrivate: true, AttemptTimeout: attempt}))
			defer p.Close()
			return p.Push(context.Background(), srv.URL+"/up")
		}},
		{"apns over http2", func(t *testing.T) error {
			srv := trickle(t, true)
			roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
			p, err := newAPNs(APNsConfig{KeyFile: keyFile, KeyID: testKeyID, TeamID: testTeamID, Topic: testTopic,
				URL: srv.URL, RootCAs: roots}, DefaultResponseHeaderTimeout, attempt)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			return p.Push(context.Background(), devToken("ab"))
		}},
		{"fcm token endpoint", func(t *testing.T) error {
			srv := trickle(t, false)
			p, err := newFCM(FCMConfig{CredentialsFile: credentials(t, srv.URL+"/token"), URL: srv.URL},
				DefaultResponseHeaderTimeout, attempt)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			return p.Push(context.Background(), "tok")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			err := tc.push(t)
			if took := time.Since(start); took > attempt+2*time.Second {
				t.Errorf("Push took %v, past the %v attempt bound", took, attempt)
			}
			if err == nil {
				t.Error("Push of a trickled answer succeeded")
			}
		})
	}
}

// An endpoint that never sends its headers is given up at the response
// header timeout, well inside a long attempt bound. Without the transport's
// ResponseHeaderTimeout (done once on purpose) it waited the whole minute.
func TestResponseHeaderTimeout(t *testing.T) {
	const header = 200 * time.Millisecond
	hang := newUPFake(t, nil)
	hang.gate = make(chan struct{})
	t.Cleanup(func() { close(hang.gate) })
	p := newUnifiedPush(withDefaults(Config{AllowPrivate: true, ResponseHeaderTimeout: header, AttemptTimeout: time.Minute}))
	defer p.Close()
	start := time.Now()
	err := p.Push(context.Background(), hang.url("/hang"))
	if took := time.Since(start); err == nil || took > header+2*time.Second {
		t.Errorf("Push = %v after %v; want an error after about %v", err, took, header)
	}
	if err != nil && !strings.Contains(err.Error(), "timeout awaiting response headers") {
		t.Errorf("Push = %v, want the header timeout", err)
	}
}

// A push is sent only when the provider's answer was read to its end:
// a body cut short or longer than the bound fails it. Before, read errors
// were ignored and the cut answer counted as sent. Ignoring readBody's
// error in caller.call (done once on purpose) turns this red.
func TestAnswerMustBeComplete(t *testing.T) {
	raw := func(answer func(w io.Writer)) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			c, buf, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			answer(buf)
			_ = buf.Flush()
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	for _, tc := range []struct {
		name   string
		answer func(w io.Writer)
		sent   bool
	}{
		{"complete", func(w io.Writer) {
			fmt.Fprint(w, "HTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nhello")
		}, true},
		{"cut short", func(w io.Writer) {
			fmt.Fprint(w, "HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\nonly ten b")
		}, false},
		{"longer than the bound", func(w io.Writer) {
			fmt.Fprintf(w, "HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n%s", maxResponse+1, strings.Repeat("x", maxResponse+1))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := raw(tc.answer)
			q := newQueue(t, Config{Workers: 1, AllowPrivate: true}, nil)
			q.Enqueue(householdJob("A", "a", srv.URL+"/up"))
			waitFor(t, "push ended", func() bool { s := q.Stats(); return s.Sent+s.Failed == 1 })
			s := closeQueue(t, q)
			if got := s.Sent == 1; got != tc.sent {
				t.Errorf("stats %+v; want sent=%v", s, tc.sent)
			}
		})
	}
}
