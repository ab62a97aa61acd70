package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/relay"
)

func newClient(t *testing.T, url, tok string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(url, tok, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// pollAll reads what is waiting for c without acknowledging anything.
func pollAll(t *testing.T, c *client.Client) []client.Envelope {
	t.Helper()
	res, err := c.Poll(context.Background(), client.PollQuery{Cursor: 0})
	if err != nil {
		t.Fatal(err)
	}
	return res.Envelopes
}

// TestSendAfterLostAnswer: the relay stores the send, its answer is lost on
// the way back, and Send's retry with the same id gets the first answer; one
// envelope is stored.
func TestSendAfterLostAnswer(t *testing.T) {
	r := newRelay(t, nil)
	proxy := servicetest.NewProxy(t, r.URL[len("http://"):])
	phone := newClient(t, r.URL, r.token("h", "phone"))
	if _, err := phone.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	laptop := newClient(t, "http://"+proxy.Addr, r.token("h", "laptop"))
	proxy.LoseNextAnswer()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := laptop.Send(ctx, "lost-1", []string{"phone"}, []byte("once"))
	if err != nil {
		t.Fatal(err)
	}
	if res.ID != "lost-1" || len(res.Deliveries) != 1 || res.Deliveries[0].Seq != 1 {
		t.Fatalf("answer %+v", res)
	}
	if got := pollAll(t, phone); len(got) != 1 || string(got[0].Payload) != "once" {
		t.Fatalf("stored %+v, want one envelope", got)
	}
}

// TestSendRefusedForGood: answers that retrying cannot fix come back at
// once as *Error, with the relay's code.
func TestSendRefusedForGood(t *testing.T) {
	r := newRelay(t, func(c *relay.Config) { c.MaxEnvelopeBytes = 16 })
	laptop := newClient(t, r.URL, r.token("h", "laptop"))
	if _, err := laptop.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := laptop.Send(context.Background(), "first", []string{"laptop"}, []byte("a")); err != nil {
		t.Fatal(err)
	}
	bad := newClient(t, r.URL, "not-a-token")
	tests := []struct {
		name    string
		c       *client.Client
		id      string
		to      []string
		payload []byte
		status  int
		code    string
	}{
		{"unknown device", laptop, "x1", []string{"nobody"}, []byte("a"), 404, "unknown_device"},
		{"empty id", laptop, "", []string{"laptop"}, []byte("a"), 400, "bad_request"},
		{"too large", laptop, "x2", []string{"laptop"}, bytes.Repeat([]byte("a"), 17), 413, "payload_too_large"},
		{"id reused", laptop, "first", []string{"laptop"}, []byte("b"), 409, "id_conflict"},
		{"bad token", bad, "x3", []string{"laptop"}, []byte("a"), 401, "unauthorized"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			begin := time.Now()
			_, err := tt.c.Send(context.Background(), tt.id, tt.to, tt.payload)
			var e *client.Error
			if !errors.As(err, &e) || e.Status != tt.status || e.Code != tt.code || e.Message == "" {
				t.Fatalf("got %v, want %d %s", err, tt.status, tt.code)
			}
			if e.Temporary() {
				t.Fatalf("%v counts as temporary", e)
			}
			if d := time.Since(begin); d > 900*time.Millisecond {
				t.Fatalf("took %v: retried?", d)
			}
		})
	}
}

// TestSendBacksOffOn429: a send refused by admission is retried after the
// Retry-After the relay gave, and then succeeds.
func TestSendBacksOffOn429(t *testing.T) {
	r := newRelay(t, func(c *relay.Config) { c.SendRate, c.SendBurst = 0.5, 1 })
	laptop := newClient(t, r.URL, r.token("h", "laptop"))
	if _, err := laptop.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := laptop.SendOnce(ctx, "a", []string{"laptop"}, []byte("a")); err != nil {
		t.Fatal(err)
	}
	_, err := laptop.SendOnce(ctx, "b", []string{"laptop"}, []byte("b"))
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 429 || e.Code != "rate_limited" || e.Limit != "send_rate" || e.RetryAfter < time.Second || e.RetryAfter > 4*time.Second || !e.Temporary() {
		t.Fatalf("second SendOnce: %v (%+v), want a 429 send_rate with Retry-After 1-4 s", err, e)
	}
	begin := time.Now()
	var logged []string
	var mu sync.Mutex
	slow := newClient(t, r.URL, r.token("h", "laptop"), client.WithLogf(func(f string, a ...any) {
		mu.Lock()
		logged = append(logged, fmt.Sprintf(f, a...))
		mu.Unlock()
	}))
	res, err := slow.Send(ctx, "b", []string{"laptop"}, []byte("b"))
	if err != nil || res.Deliveries[0].Seq != 2 {
		t.Fatalf("Send: %+v, %v", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(logged) == 0 || time.Since(begin) < time.Second {
		t.Fatalf("Send succeeded after %v with retries %q: it did not wait for Retry-After", time.Since(begin), logged)
	}
}

// TestSendGivesUpWithContext: a relay that cannot be reached is retried
// until the context ends, and the error says so.
func TestSendGivesUpWithContext(t *testing.T) {
	r := newRelay(t, nil)
	proxy := servicetest.NewProxy(t, r.URL[len("http://"):])
	proxy.Cut()
	c := newClient(t, "http://"+proxy.Addr, r.token("h", "laptop"))
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	_, err := c.Send(ctx, "x", []string{"laptop"}, []byte("a"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the context's deadline", err)
	}
}

// listenUntil runs Listen until n envelopes were handled or d passed; it
// returns what was handled and Listen's error.
func listenUntil(t *testing.T, c *client.Client, cursors client.CursorStore, n int, d time.Duration) ([]client.Envelope, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var got []client.Envelope
	err := c.Listen(ctx, cursors, func(ctx context.Context, e client.Envelope) error {
		got = append(got, e)
		if len(got) == n {
			cancel()
		}
		return nil
	})
	return got, err
}

func seqs(es []client.Envelope) []int64 {
	var out []int64
	for _, e := range es {
		out = append(out, e.Seq)
	}
	return out
}

func upTo(from, to int64) []int64 {
	var out []int64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// TestListenMore: a poll budget of one small envelope makes every answer
// say more; Listen polls again at once and hands over each envelope once,
// in order, in both codecs, and the cursor it saved is the last seq.
func TestListenMore(t *testing.T) {
	for _, codec := range []client.Codec{client.JSON, client.MessagePack} {
		t.Run(codec.ContentType(), func(t *testing.T) {
			r := newRelay(t, func(c *relay.Config) { c.PollBudgetBytes = 4 })
			phone := newClient(t, r.URL, r.token("h", "phone"), client.WithCodec(codec), client.WithWait(5))
			if _, err := phone.Register(context.Background()); err != nil {
				t.Fatal(err)
			}
			laptop := newClient(t, r.URL, r.token("h", "laptop"), client.WithCodec(codec))
			for i := range 20 {
				payload := []byte{0, 0xff, byte(i), '\n', 'x'} // bytes, not text
				if _, err := laptop.Send(context.Background(), client.NewID(), []string{"phone"}, payload); err != nil {
					t.Fatal(err)
				}
			}
			cursors := &client.MemoryCursor{}
			got, err := listenUntil(t, phone, cursors, 20, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(seqs(got), upTo(1, 20)) {
				t.Fatalf("handled seqs %v", seqs(got))
			}
			for i, e := range got {
				if !bytes.Equal(e.Payload, []byte{0, 0xff, byte(i), '\n', 'x'}) || e.From != "laptop" {
					t.Fatalf("envelope %d: %+v", i, e)
				}
				if _, err := e.Time(); err != nil {
					t.Fatal(err)
				}
			}
			if c, _ := cursors.Load(context.Background()); c.Cursor != 20 {
				t.Fatalf("saved cursor %+v, want 20", c)
			}
		})
	}
}

// TestListenHandlerError: a handler's error stops Listen with the cursor
// below that envelope, and the next Listen hands it over again.
func TestListenHandlerError(t *testing.T) {
	r := newRelay(t, nil)
	phone := newClient(t, r.URL, r.token("h", "phone"), client.WithWait(5))
	if _, err := phone.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	laptop := newClient(t, r.URL, r.token("h", "laptop"))
	for range 5 {
		if _, err := laptop.Send(context.Background(), client.NewID(), []string{"phone"}, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	cursors := client.FileCursor(filepath.Join(t.TempDir(), "cursor"))
	boom := errors.New("disk full")
	var handled []int64
	err := phone.Listen(context.Background(), cursors, func(ctx context.Context, e client.Envelope) error {
		if e.Seq == 3 {
			return boom
		}
		handled = append(handled, e.Seq)
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Listen returned %v, want the handler's error", err)
	}
	if c, _ := cursors.Load(context.Background()); c.Cursor != 2 || !slices.Equal(handled, []int64{1, 2}) {
		t.Fatalf("cursor %+v after handling %v, want 2", c, handled)
	}
	got, err := listenUntil(t, phone, cursors, 3, 10*time.Second)
	if err != nil || !slices.Equal(seqs(got), []int64{3, 4, 5}) {
		t.Fatalf("second Listen handled %v (%v), want 3 4 5", seqs(got), err)
	}
}

// TestListenCursorAhead: a saved cursor far above the device's head (data
// restored from an older backup) is recovered by a poll without cursor,
// which hands over everything the relay still holds; taking the head as the
// cursor would have skipped it.
func TestListenCursorAhead(t *testing.T) {
	r := newRelay(t, nil)
	phone := newClient(t, r.URL, r.token("h", "phone"), client.WithWait(5))
	if _, err := phone.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	laptop := newClient(t, r.URL, r.token("h", "laptop"))
	for range 5 {
		if _, err := laptop.Send(context.Background(), client.NewID(), []string{"phone"}, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := phone.Ack(context.Background(), client.Position{Cursor: 2}); err != nil {
		t.Fatal(err)
	}
	cursors := &client.MemoryCursor{}
	cursors.Save(context.Background(), client.Position{Cursor: 1000})
	got, err := listenUntil(t, phone, cursors, 3, 10*time.Second)
	if err != nil || !slices.Equal(seqs(got), []int64{3, 4, 5}) {
		t.Fatalf("handled %v (%v), want 3 4 5", seqs(got), err)
	}
	if c, _ := cursors.Load(context.Background()); c.Cursor != 5 {
		t.Fatalf("cursor %+v, want 5", c)
	}

	// Nothing waiting: the recovery takes the relay's cursor and holds on.
	if err := phone.Ack(context.Background(), client.Position{Cursor: 5}); err != nil {
		t.Fatal(err)
	}
	cursors.Save(context.Background(), client.Position{Cursor: 1000})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- phone.Listen(ctx, cursors, func(context.Context, client.Envelope) error { return errors.New("nothing was sent") })
	}()
	deadline := time.Now().Add(10 * time.Second)
	for c, _ := cursors.Load(ctx); c.Cursor != 5; c, _ = cursors.Load(ctx) {
		select {
		case err := <-done:
			t.Fatalf("Listen returned %v with the cursor at %+v", err, c)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("cursor still %+v", c)
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of the cursor
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestListenThroughOutage: with the relay unreachable for a while, Listen
// keeps trying and hands over what was sent meanwhile; a cancel while a
// poll is held ends it at once with nil.
func TestListenThroughOutage(t *testing.T) {
	r := newRelay(t, nil)
	proxy := servicetest.NewProxy(t, r.URL[len("http://"):])
	phone := newClient(t, "http://"+proxy.Addr, r.token("h", "phone"), client.WithWait(30))
	if _, err := phone.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	laptop := newClient(t, r.URL, r.token("h", "laptop"))
	_, cancel, got, done := listenOn(phone, &client.MemoryCursor{})
	defer cancel()
	send := func(text string) {
		if _, err := laptop.Send(context.Background(), client.NewID(), []string{"phone"}, []byte(text)); err != nil {
			t.Fatal(err)
		}
	}
	receive := func(want string) {
		select {
		case e := <-got:
			if string(e.Payload) != want {
				t.Fatalf("got %q, want %q", e.Payload, want)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("%q not handed over", want)
		}
	}
	send("before")
	receive("before")
	proxy.Cut()
	send("during")
	proxy.Restore()
	receive("during")

	begin := time.Now()
	cancel() // a poll is held now, or about to be
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Listen returned %v on cancel", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Listen did not return on cancel")
	}
	if d := time.Since(begin); d > 2*time.Second {
		t.Fatalf("Listen took %v to stop", d)
	}
}

// TestListenRefusesShortTimeout: an HTTP client that would give up on a
// held poll before the relay answers is refused up front.
func TestListenRefusesShortTimeout(t *testing.T) {
	c := newClient(t, "http://127.0.0.1:1", "t", client.WithWait(20), client.WithHTTPClient(&http.Client{Timeout: 20 * time.Second}))
	if err := c.Listen(context.Background(), &client.MemoryCursor{}, nil); err == nil {
		t.Fatal("Listen accepted an HTTP timeout no longer than its wait")
	}
}

// TestListenUnauthorized: a refused token stops Listen with the 401.
func TestListenUnauthorized(t *testing.T) {
	r := newRelay(t, nil)
	c := newClient(t, r.URL, "not-a-token", client.WithWait(5))
	err := c.Listen(context.Background(), &client.MemoryCursor{}, func(context.Context, client.Envelope) error { return nil })
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 401 {
		t.Fatalf("got %v, want a 401", err)
	}
}

func TestFileCursor(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f := client.FileCursor(filepath.Join(dir, "c"))
	if p, err := f.Load(ctx); p != (client.Position{}) || err != nil {
		t.Fatalf("missing file: %+v, %v", p, err)
	}
	for _, p := range []client.Position{{Cursor: 7}, {Cursor: 1 << 62, Epoch: "AAAAAAAAAAAAAAAA"}, {Cursor: 3, Epoch: "x_-9"}} {
		if err := f.Save(ctx, p); err != nil {
			t.Fatal(err)
		}
		if got, err := f.Load(ctx); got != p || err != nil {
			t.Fatalf("saved %+v, loaded %+v, %v", p, got, err)
		}
	}
	b, _ := os.ReadFile(string(f))
	if string(b) != "3 x_-9\n" {
		t.Fatalf("file holds %q", b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("%d files left in the directory, want only the cursor", len(entries))
	}
	if err := f.Save(ctx, client.Position{Cursor: 4, Epoch: "a b"}); err == nil {
		t.Fatal("an epoch with a space saved")
	}
	// A file written before epochs: the cursor, no epoch.
	os.WriteFile(string(f), []byte("12\n"), 0o600)
	if p, err := f.Load(ctx); p != (client.Position{Cursor: 12}) || err != nil {
		t.Fatalf("a cursor alone loaded as %+v, %v", p, err)
	}
	for _, bad := range []string{"-1\n", "twelve", "12 a/b\n", "12 " + strings.Repeat("a", 33), " AAAA"} {
		os.WriteFile(string(f), []byte(bad), 0o600)
		if p, err := f.Load(ctx); err == nil {
			t.Errorf("%q loaded as %+v", bad, p)
		}
	}
}

func TestNewID(t *testing.T) {
	a, b := client.NewID(), client.NewID()
	if a == b || len(a) != 22 {
		t.Fatalf("ids %q %q", a, b)
	}
}

func TestNewRefuses(t *testing.T) {
	for _, tt := range []struct{ url, tok string }{{"127.0.0.1:8080", "t"}, {"http://x", " "}} {
		if _, err := client.New(tt.url, tt.tok); err == nil {
			t.Errorf("New(%q, %q) accepted", tt.url, tt.tok)
		}
	}
}

// countingTransport counts the polls that pass through it.
type countingTransport struct{ polls atomic.Int64 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/v1/poll" {
		c.polls.Add(1)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestTwoListenersDoNotSpin: two copies of an app listening as one device
// supersede each other's held poll; each waits a moment after a held poll
// that ended empty at once, so together they make a few polls a second,
// not thousands, and both still get what is sent.
func TestTwoListenersDoNotSpin(t *testing.T) {
	r := newRelay(t, nil)
	counter := &countingTransport{}
	hc := &http.Client{Transport: counter}
	phone := r.token("h", "phone")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var handled atomic.Int64
	for range 2 {
		c := newClient(t, r.URL, phone, client.WithHTTPClient(hc))
		wg.Go(func() {
			_ = c.Listen(ctx, &client.MemoryCursor{}, func(context.Context, client.Envelope) error {
				handled.Add(1)
				return nil
			})
		})
	}
	laptop := newClient(t, r.URL, r.token("h", "laptop"))
	deadline := time.Now().Add(2 * time.Second)
	for handled.Load() == 0 && time.Now().Before(deadline) {
		if _, err := laptop.Send(ctx, client.NewID(), []string{"phone"}, []byte("x")); err != nil && ctx.Err() == nil {
			t.Logf("send: %v", err) // the phone registers on its first poll
		}
		time.Sleep(200 * time.Millisecond) // a send every 200 ms until one is handled
	}
	wg.Wait()
	if n := counter.polls.Load(); n > 20 {
		t.Errorf("two listeners of one device made %d polls in 3 s: they spin", n)
	}
	if handled.Load() == 0 {
		t.Error("no envelope reached either listener")
	}
}

// listenOn runs c.Listen with cursors until cancel is called, handing
// each envelope to got; done gets what Listen returned.
func listenOn(c *client.Client, cursors client.CursorStore) (ctx context.Context, cancel context.CancelFunc, got chan client.Envelope, done chan error) {
	ctx, cancel = context.WithCancel(context.Background())
	got = make(chan client.Envelope, 100)
	done = make(chan error, 1)
	go func() {
		done <- c.Listen(ctx, cursors, func(_ context.Context, e client.Envelope) error {
			got <- e
			return nil
		})
	}()
	return ctx, cancel, got, done
}
