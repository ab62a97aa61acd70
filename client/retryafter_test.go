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
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
)

// TestRetryAfterCapped: a Retry-After far above what the relay sends (a
// misconfigured proxy's), or one that overflows a Duration, is taken as
// MaxRetryAfter; a Send refused so makes one request and waits the cap,
// not days and not a moment.
func TestRetryAfterCapped(t *testing.T) {
	var header atomic.Value
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Retry-After", header.Load().(string))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":"unavailable","message":"later"}`)
	}))
	defer srv.Close()
	for _, tc := range []struct {
		header string
		want   time.Duration
	}{
		{"3", 3 * time.Second},
		{"60", time.Minute},
		{"61", client.MaxRetryAfter},
		{"2147484", client.MaxRetryAfter},
		{"9999999999999", client.MaxRetryAfter},              // overflows a Duration
		{"99999999999999999999999999", client.MaxRetryAfter}, // overflows an int64
		{"Wed, 21 Oct 2015 07:28:00 GMT", 0},
	} {
		header.Store(tc.header)
		c := newClient(t, srv.URL, "tok")
		_, err := c.SendOnce(context.Background(), "x", []string{"phone"}, []byte("a"))
		var e *client.Error
		if !errors.As(err, &e) {
			t.Fatalf("Retry-After %s: %v, want a *client.Error", tc.header, err)
		}
		if e.RetryAfter != tc.want {
			t.Errorf("Retry-After %s: RetryAfter %v, want %v", tc.header, e.RetryAfter, tc.want)
		}
	}

	header.Store("2147484")
	requests.Store(0)
	var mu sync.Mutex
	var logged []string
	c := newClient(t, srv.URL, "tok", client.WithLogf(func(f string, a ...any) {
		mu.Lock()
		logged = append(logged, fmt.Sprintf(f, a...))
		mu.Unlock()
	}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := c.Send(ctx, "x", []string{"phone"}, []byte("a")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send: %v, want the context's deadline", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := requests.Load(); n != 1 || len(logged) != 1 || !strings.HasSuffix(logged[0], "retrying in 1m0s") {
		t.Fatalf("%d requests in a second, retries %q; want one, retrying in 1m0s", n, logged)
	}
}
