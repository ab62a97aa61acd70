package client_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/internal/servicetest"
)

// recorded is what a WithStateFunc callback heard.
type recorded struct {
	mu sync.Mutex
	s  []client.State
}

func (r *recorded) add(s client.State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.s = append(r.s, s)
}

func (r *recorded) all() []client.State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.s)
}

func (r *recorded) saw(kind client.StateKind, transport string) bool {
	for _, s := range r.all() {
		if s.Kind == kind && s.Transport == transport {
			return true
		}
	}
	return false
}

// listenInto runs c's Listen on a goroutine, handing envelopes to got.
func listenInto(t *testing.T, c *client.Client, cursors client.CursorStore) (got chan client.Envelope, stop func() error) {
	t.Helper()
	_, cancel, got, done := listenOn(c, cursors)
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			return fmt.Errorf("Listen did not stop")
		}
	}
	t.Cleanup(func() { _ = stop() })
	return got, stop
}

func expect(t *testing.T, got <-chan client.Envelope, want ...string) {
	t.Helper()
	for _, w := range want {
		select {
		case e := <-got:
			if string(e.Payload) != w {
				t.Fatalf("got %q, want %q", e.Payload, w)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("%q not handed over", w)
		}
	}
	select {
	case e := <-got:
		t.Fatalf("%q handed over too (a repeat, or out of order)", e.Payload)
	default:
	}
}

// TestListenStreams: Listen receives over a stream by default, says so in
// its states (connecting, then connected over the stream, no poll
// waiting), and a stream cut by a proxy resumes from its cursor with
// nothing lost or repeated.
func TestListenStreams(t *testing.T) {
	r := newRelay(t, nil)
	proxy := servicetest.NewProxy(t, r.URL[len("http://"):])
	var st recorded
	phone := newClient(t, "http://"+proxy.Addr, r.token("h", "phone"), client.WithStateFunc(st.add))
	if _, err := phone.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	laptop := newClient(t, r.URL, r.token("h", "laptop"))
	send := func(text string) {
		t.Helper()
		if _, err := laptop.Send(context.Background(), client.NewID(), []string{"phone"}, []byte(text)); err != nil {
			t.Fatal(err)
		}
	}
	send("before")
	got, stop := listenInto(t, phone, &client.MemoryCursor{})
	expect(t, got, "before")
	send("one")
	send("two")
	expect(t, got, "one", "two")
	if !st.saw(client.StateConnecting, client.TransportStream) || !st.saw(client.StateConnected, client.TransportStream) {
		t.Fatalf("states %v: no connecting and connected over the stream", st.all())
	}
	if st.saw(client.StateWaiting, client.TransportPoll) {
		t.Fatalf("states %v: Listen polled", st.all())
	}
	proxy.Cut()
	send("during")
	proxy.Restore()
	expect(t, got, "during")
	send("after")
	expect(t, got, "after")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if s := st.all(); s[len(s)-1].Kind != client.StateStopped {
		t.Fatalf("last state %v, want stopped", s[len(s)-1])
	}
}

// bufferingProxy answers each request only once the relay's whole answer
// is in: as a proxy configured to buffer answers does.
func bufferingProxy(t *testing.T, upstream string, streams *atomic.Int32) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/stream" {
			streams.Add(1)
		}
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, upstream+r.URL.RequestURI(), r.Body)
		req.Header = r.Header.Clone()
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return
		}
		for k, vs := range resp.Header {
			w.Header()[k] = vs
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestListenFallsBackToPolls: where a proxy holds the stream's answer
// back, or the relay does not serve streams, Listen finds out by itself
// and polls, and receives everything.
func TestListenFallsBackToPolls(t *testing.T) {
	defer client.SetStreamTimeouts(300*time.Millisecond, time.Minute)()
	t.Run("buffering proxy", func(t *testing.T) {
		r := newRelay(t, nil)
		var streams atomic.Int32
		proxy := bufferingProxy(t, r.URL, &streams)
		var st recorded
		phone := newClient(t, proxy.URL, r.token("h", "phone"), client.WithStateFunc(st.add), client.WithWait(2))
		if _, err := phone.Register(context.Background()); err != nil {
			t.Fatal(err)
		}
		laptop := newClient(t, r.URL, r.token("h", "laptop"))
		got, _ := listenInto(t, phone, &client.MemoryCursor{})
		for i := range 3 {
			if _, err := laptop.Send(context.Background(), client.NewID(), []string{"phone"}, []byte(fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
			expect(t, got, fmt.Sprint(i))
		}
		if !st.saw(client.StateWaiting, client.TransportPoll) {
			t.Fatalf("states %v: Listen never polled", st.all())
		}
		if n := streams.Load(); n != 1 {
			t.Fatalf("%d streams tried, want 1 before polling", n)
		}
	})
	t.Run("no stream served", func(t *testing.T) {
		r := newRelay(t, nil)
		mux := http.NewServeMux()
		up, err := url.Parse(r.URL)
		if err != nil {
			t.Fatal(err)
		}
		mux.Handle("/v1/stream", http.NotFoundHandler())
		mux.Handle("/", httputil.NewSingleHostReverseProxy(up))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		phone := newClient(t, srv.URL, r.token("h", "phone"), client.WithWait(2))
		if _, err := phone.Register(context.Background()); err != nil {
			t.Fatal(err)
		}
		laptop := newClient(t, r.URL, r.token("h", "laptop"))
		got, _ := listenInto(t, phone, &client.MemoryCursor{})
		if _, err := laptop.Send(context.Background(), client.NewID(), []string{"phone"}, []byte("x")); err != nil {
			t.Fatal(err)
		}
		expect(t, got, "x")
	})
}
