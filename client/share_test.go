package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
)

// TestClientsShareOneHTTPClient: clients of many tokens on one HTTP
// client use its connections, each request with its own client's token,
// as a process acting for many devices needs.
func TestClientsShareOneHTTPClient(t *testing.T) {
	var mu sync.Mutex
	var seen []string // "remote addr|Authorization"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.RemoteAddr+"|"+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"household":"h","device":"d","cursor":0}`))
	}))
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	a := newClient(t, srv.URL, "tok-a", client.WithHTTPClient(hc))
	b := newClient(t, srv.URL, "tok-b", client.WithHTTPClient(hc))
	for _, c := range []*client.Client{a, b, a} {
		if _, err := c.Register(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 {
		t.Fatalf("%d requests, want 3", len(seen))
	}
	addr := func(s string) string { return s[:len(s)-len("|Bearer tok-a")] }
	if addr(seen[0]) != addr(seen[1]) || addr(seen[1]) != addr(seen[2]) {
		t.Errorf("clients did not share the connection: %q", seen)
	}
	for i, want := range []string{"tok-a", "tok-b", "tok-a"} {
		if got := seen[i][len(seen[i])-len(want):]; got != want {
			t.Errorf("request %d carried %q, want %s", i, seen[i], want)
		}
	}
}

// TestHTTPClientTimeoutRules: the client's own request timeout bounds a
// request unless the HTTP client has a Timeout, which then bounds it
// alone, longer or shorter.
func TestHTTPClientTimeoutRules(t *testing.T) {
	const answerAfter = 600 * time.Millisecond
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(answerAfter): // a slow relay
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		w.Write([]byte(`{"id":"x","deliveries":[{"device":"phone","seq":1}]}`))
	}))
	t.Cleanup(srv.Close)
	short := 100 * time.Millisecond
	for _, tt := range []struct {
		name     string
		opts     []client.Option
		timesOut bool
	}{
		{"own timeout", []client.Option{client.WithRequestTimeout(short)}, true},
		{"HTTP client's longer timeout wins", []client.Option{client.WithRequestTimeout(short), client.WithHTTPClient(&http.Client{Timeout: 10 * time.Second})}, false},
		{"HTTP client's shorter timeout wins", []client.Option{client.WithRequestTimeout(10 * time.Second), client.WithHTTPClient(&http.Client{Timeout: short})}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newClient(t, srv.URL, "t", tt.opts...)
			begin := time.Now()
			res, err := c.SendOnce(context.Background(), "x", []string{"phone"}, []byte("p"))
			took := time.Since(begin)
			if !tt.timesOut {
				if err != nil || len(res.Deliveries) != 1 {
					t.Fatalf("got %+v, %v after %v, want the answer", res, err, took)
				}
				return
			}
			var e *client.Error
			if err == nil || errors.As(err, &e) {
				t.Fatalf("got %+v, %v, want no answer", res, err)
			}
			var timeout interface{ Timeout() bool }
			if !errors.As(err, &timeout) || !timeout.Timeout() {
				t.Errorf("error %v is not a timeout", err)
			}
			if took >= answerAfter {
				t.Errorf("gave up after %v, want about %v", took, short)
			}
		})
	}
}
