package tally

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/loadtest/internal/answer"
	"github.com/flamenet/relay/loadtest/report"
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
	tr := &http.Transport{}
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
			c, err := client.New(srv.URL, tt.tok, client.WithHTTPClient(hc), client.WithCodec(client.MessagePack))
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.SendOnce(context.Background(), "id", []string{"r0"}, []byte("p"))
			if err == nil {
				t.Fatal("no error")
			}
			if got := answer.ErrKind("send", err); got != tt.kind {
				t.Errorf("ErrKind = %q, want %q (%v)", got, tt.kind, err)
			}
			if got := answer.Retryable(err); got != tt.retryable {
				t.Errorf("retryable = %v, want %v", got, tt.retryable)
			}
			var e *client.Error
			if errors.As(err, &e) != (tt.kind != "send transport" && tt.kind != "send timeout") {
				t.Errorf("answer %v read as %+v", err, e)
			}
			tl := New(Config{})
			now := time.Now()
			tl.Failure("send", 0, err, now, now)
			counted := tl.counts.errors
			if tt.turnedAway {
				counted = tl.counts.refused
			}
			if counted[tt.kind] != 1 || len(tl.counts.refused)+len(tl.counts.errors) != 1 || len(tl.counts.retried) != 0 {
				t.Errorf("counted refused %v, errors %v, retried %v", tl.counts.refused, tl.counts.errors, tl.counts.retried)
			}
			if want := tt.tok == "limited"; (tl.counts.householdRefused == 1) != want {
				t.Errorf("household refusals %d", tl.counts.householdRefused)
			}
			if d := answer.RetryWait(0, err); d < tt.backoff {
				t.Errorf("backoff %v, want at least the Retry-After %v", d, tt.backoff)
			}
			if tt.tok == "ahead" && (!e.CursorAhead() || e.Head != 7) {
				t.Errorf("cursor_ahead read as %+v", e)
			}
		})
	}
}

// TestSendIndex: an arrival's id names one of this run's sends, or none.
func TestSendIndex(t *testing.T) {
	r := New(Config{Tag: "a1b2c3d4"})
	r.Plan(5)
	other := New(Config{Tag: "e5f6a7b8"})
	for _, tc := range []struct {
		id   string
		want int
	}{
		{r.SendID(0), 0},
		{r.SendID(4), 4},
		{r.SendID(5), -1},      // beyond the schedule
		{other.SendID(1), -1},  // another run's send
		{r.cfg.Tag + "-x", -1}, // not a number
		{"", -1},
	} {
		if got := r.sendIndex(tc.id); got != tc.want {
			t.Errorf("sendIndex(%q) = %d, want %d", tc.id, got, tc.want)
		}
	}
}

// TestProgressLatencies: a progress line prints the latency as the
// summary does; sub-millisecond samples read 0.1 ms in both, not 0s in
// one. Seen red when progress rounded to the millisecond.
func TestProgressLatencies(t *testing.T) {
	samples := []time.Duration{80 * time.Microsecond, 100 * time.Microsecond, 120 * time.Microsecond, 2500 * time.Microsecond}
	p50, p99 := progressLatencies(slices.Clone(samples))
	s := report.Summarize(samples)
	if want := report.FormatMS(s.P50); p50 != want || p50 != "0.1 ms" {
		t.Errorf("progress p50 %q, summary %q", p50, want)
	}
	if want := report.FormatMS(s.P99); p99 != want {
		t.Errorf("progress p99 %q, summary %q", p99, want)
	}
	if p50, p99 := progressLatencies(nil); p50 != "" || p99 != "" {
		t.Errorf("no samples: %q %q", p50, p99)
	}
}
