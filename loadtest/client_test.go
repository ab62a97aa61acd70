package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
)

// TestErrorCounting: what the relay answers over real HTTP, through the
// client package, is named, retried and counted as refused or as an error
// as the tester's figures say.
func TestErrorCounting(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read whole, so that the server notices the client hanging up.
		io.Copy(io.Discard, r.Body)
		switch r.Header.Get("Authorization") {
		case "Bearer busy":
			w.Header().Set("Retry-After", "3")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"unavailable","message":"draining"}`))
		case "Bearer limited":
			w.Header().Set("Content-Type", "application/msgpack")
			w.WriteHeader(http.StatusTooManyRequests)
			// {"error":"rate_limited","limit":"household_send_rate"}
			w.Write([]byte("\x82\xa5error\xacrate_limited\xa5limit\xb3household_send_rate"))
		case "Bearer ahead":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			w.Write([]byte(`{"error":"cursor_ahead","message":"m","head":7}`))
		case "Bearer broken":
			http.Error(w, "boom", http.StatusInternalServerError)
		case "Bearer hangup":
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
		case "Bearer slow":
			<-r.Context().Done()
		}
	}))
	t.Cleanup(srv.Close)
	tr := newTransport(8, 1)
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 300 * time.Millisecond}
	for _, tt := range []struct {
		tok        string
		kind       string
		retryable  bool
		turnedAway bool
		backoff    time.Duration // at least
	}{
		{"busy", "send 503 unavailable", true, true, 3 * time.Second},
		{"limited", "send 429 rate_limited (household_send_rate)", false, true, 0},
		{"ahead", "send 409 cursor_ahead", false, false, 0},
		{"broken", "send 500", false, false, 0},
		{"hangup", "send transport", true, false, 0},
		{"slow", "send timeout", true, false, 0},
	} {
		t.Run(tt.tok, func(t *testing.T) {
			c, err := client.New(srv.URL, tt.tok, client.WithHTTPClient(hc), client.WithCodec(codec("msgpack")))
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.SendOnce(context.Background(), "id", []string{"r0"}, []byte("p"))
			if err == nil {
				t.Fatal("no error")
			}
			if got := errKind("send", err); got != tt.kind {
				t.Errorf("errKind = %q, want %q (%v)", got, tt.kind, err)
			}
			if got := retryable(err); got != tt.retryable {
				t.Errorf("retryable = %v, want %v", got, tt.retryable)
			}
			var e *client.Error
			if errors.As(err, &e) != (tt.kind != "send transport" && tt.kind != "send timeout") {
				t.Errorf("answer %v read as %+v", err, e)
			}
			r := testRunner(t, []string{srv.URL}, 1)
			now := time.Now()
			r.failure("send", 0, err, now, now)
			counted := r.counts.errors
			if tt.turnedAway {
				counted = r.counts.refused
			}
			if counted[tt.kind] != 1 || len(r.counts.refused)+len(r.counts.errors) != 1 || len(r.counts.retried) != 0 {
				t.Errorf("counted refused %v, errors %v, retried %v", r.counts.refused, r.counts.errors, r.counts.retried)
			}
			if want := tt.tok == "limited"; (r.counts.householdRefused == 1) != want {
				t.Errorf("household refusals %d", r.counts.householdRefused)
			}
			if d := backoff(0, err); d < tt.backoff {
				t.Errorf("backoff %v, want at least the Retry-After %v", d, tt.backoff)
			}
			if tt.tok == "ahead" && (!e.CursorAhead() || e.Head != 7) {
				t.Errorf("cursor_ahead read as %+v", e)
			}
		})
	}
}
