package client_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/internal/pairtest"
)

// states records a client's connection states.
type states struct {
	mu   sync.Mutex
	seen []client.State
}

func (s *states) add(st client.State) {
	s.mu.Lock()
	s.seen = append(s.seen, st)
	s.mu.Unlock()
}

func (s *states) kinds() []client.StateKind {
	s.mu.Lock()
	defer s.mu.Unlock()
	var k []client.StateKind
	for _, st := range s.seen {
		k = append(k, st.Kind)
	}
	return k
}

// paired pairs device at cr into store and returns a client using a
// renewing source on the test's clock.
func paired(t *testing.T, cr *pairtest.Contract, device string, store client.CredentialStore, opts ...client.Option) (*client.Client, *client.Renewing) {
	t.Helper()
	ctx := context.Background()
	if _, err := client.Pair(ctx, cr.URL, cr.Invite(device), client.PairOptions{Store: store}); err != nil {
		t.Fatal(err)
	}
	return renewingClient(t, cr, store, opts...)
}

func renewingClient(t *testing.T, cr *pairtest.Contract, store client.CredentialStore, opts ...client.Option) (*client.Client, *client.Renewing) {
	t.Helper()
	src, err := client.NewRenewing(context.Background(), cr.URL, store, client.RenewingOptions{Now: cr.Clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithCredentials(cr.URL, src, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c, src
}

// checkedStore is a store that remembers every access token saved, so
// that the relay's side can check each token it sees was saved first.
type checkedStore struct {
	client.MemoryStore
	mu    sync.Mutex
	saved map[string]bool
	fail  error // Save fails with it when set
}

func (s *checkedStore) Save(ctx context.Context, c client.Credentials) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	if s.saved == nil {
		s.saved = map[string]bool{}
	}
	s.saved[c.AccessToken] = true
	return s.MemoryStore.Save(ctx, c)
}

func (s *checkedStore) wasSaved(tok string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saved[tok]
}

// TestListenerOutlivesShortTokens is the issue's "a listener with a
// 2-minute access token keeps receiving for 10 minutes without a 401
// reaching the app": the relay's and the client's clocks are one fake
// clock, moved 10 s at a time for 10 minutes while a sender sends one
// envelope per step. Every envelope arrives, in order; the relay never
// answers 401 (renewal comes before expiry, not after a refusal); the
// state callback never says unauthorized; each token the relay sees was
// in the store before it was used; and the source renewed about every
// 80 s (2 minutes less a third).
func TestListenerOutlivesShortTokens(t *testing.T) { forModes(t, testListenerOutlivesShortTokens) }

func testListenerOutlivesShortTokens(t *testing.T, mode pairtest.Mode) {
	clock := pairtest.NewClock()
	cr := pairtest.NewContractMode(t, mode, clock, 2*time.Minute)
	store := &checkedStore{}
	var st states
	// Polls: the relay ends a stream at its token's expiry on its own
	// (real) clock, which this test's clock does not move
	// (TestStreamEndsWithItsToken in package relay).
	phone, src := paired(t, cr, "phone", store, client.WithWait(1), client.WithStateFunc(st.add), client.WithStreams(false))
	laptop := newClient(t, cr.URL, cr.Mint("laptop", time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := phone.Register(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 100)
	done := make(chan error, 1)
	go func() {
		done <- phone.Listen(ctx, &client.MemoryCursor{}, func(_ context.Context, e client.Envelope) error {
			got <- string(e.Payload)
			return nil
		})
	}()
	const steps = 60 // 10 minutes of 10 s
	for i := range steps {
		clock.Advance(10 * time.Second)
		want := fmt.Sprintf("m%d", i)
		if _, err := laptop.Send(ctx, client.NewID(), []string{"phone"}, []byte(want)); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		select {
		case g := <-got:
			if g != want {
				t.Fatalf("step %d: got %q, want %q", i, g, want)
			}
		case err := <-done:
			t.Fatalf("step %d: Listen returned %v", i, err)
		case <-time.After(15 * time.Second):
			t.Fatalf("step %d: %q not received", i, want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Listen: %v", err)
	}
	renewals, refused := cr.Counts()
	if refused != 0 {
		t.Errorf("the relay answered 401 %d times", refused)
	}
	// One renewal per 80 s, at the first poll that finds it due: the
	// listener's next poll goes out before or after the clock's next
	// step, so 80 or 90 s apart: 6 or 7 in 600 s.
	if renewals < 6 || renewals > 7 {
		t.Errorf("%d renewals in 10 minutes of 2-minute tokens, want 6 or 7 (at %v, from %v)", renewals, cr.RenewedAt, clock.Now().Add(-600*time.Second))
	}
	if k := st.kinds(); slices.Contains(k, client.StateUnauthorized) || !slices.Contains(k, client.StateWaiting) || !slices.Contains(k, client.StateConnected) {
		t.Errorf("states %v", k)
	}
	cr.Mu.Lock()
	bearers := slices.Clone(cr.Bearers)
	cr.Mu.Unlock()
	laptopTok := ""
	for _, b := range bearers {
		if !store.wasSaved(b) && b != laptopTok {
			if laptopTok == "" {
				laptopTok = b // the sender's fixed token, never stored
				continue
			}
			t.Errorf("the relay saw a token that was never saved: %.20s...", b)
		}
	}
	saved, err := store.Load(context.Background())
	if err != nil || saved != src.Credentials() {
		t.Errorf("store holds %+v (%v), source uses %+v", saved, err, src.Credentials())
	}
}

// TestRenewalTiming: a 2-minute token is renewed once 40 s (a third) are
// left, not before; a 1-hour token 5 minutes before its end. Red when the
// lead is always 5 minutes (the 2-minute token renews at once) or always a
// third (the hour's token renews at 40 minutes).
func TestRenewalTiming(t *testing.T) { forModes(t, testRenewalTiming) }

func testRenewalTiming(t *testing.T, mode pairtest.Mode) {
	for _, tt := range []struct {
		name       string
		ttl, renew time.Duration
	}{
		{"2 minutes", 2 * time.Minute, 80 * time.Second},
		{"1 hour", time.Hour, 55 * time.Minute},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock := pairtest.NewClock()
			cr := pairtest.NewContractMode(t, mode, clock, tt.ttl)
			c, _ := paired(t, cr, "phone", &client.MemoryStore{})
			ctx := context.Background()
			clock.Advance(tt.renew - time.Second)
			if _, err := c.Register(ctx); err != nil {
				t.Fatal(err)
			}
			if n, _ := cr.Counts(); n != 0 {
				t.Fatalf("renewed %d times a second before it was due", n)
			}
			clock.Advance(time.Second)
			if _, err := c.Register(ctx); err != nil {
				t.Fatal(err)
			}
			if n, _ := cr.Counts(); n != 1 {
				t.Fatalf("renewed %d times when due, want 1", n)
			}
		})
	}
}

// TestRenewalWithClockAhead: a client whose clock is 100 s ahead of the
// relay's finds its loaded 2-minute token due at once and renews it; the
// new token is then judged by the client's own clock from when it came,
// due 80 s later, not at once again. Red when only the relay's exp is
// used (every call renews) or when a call may renew more than once (the
// first call never returns).
func TestRenewalWithClockAhead(t *testing.T) { forModes(t, testRenewalWithClockAhead) }

func testRenewalWithClockAhead(t *testing.T, mode pairtest.Mode) {
	clock := pairtest.NewClock()
	cr := pairtest.NewContractMode(t, mode, clock, 2*time.Minute)
	store := &client.MemoryStore{}
	if _, err := client.Pair(context.Background(), cr.URL, cr.Invite("phone"), client.PairOptions{Store: store}); err != nil {
		t.Fatal(err)
	}
	src, err := client.NewRenewing(context.Background(), cr.URL, store, client.RenewingOptions{Now: func() time.Time { return clock.Now().Add(100 * time.Second) }})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithCredentials(cr.URL, src)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, tt := range []struct {
		advance  time.Duration
		renewals int
	}{{0, 1}, {0, 1}, {79 * time.Second, 1}, {time.Second, 2}} {
		clock.Advance(tt.advance)
		if _, err := c.Register(ctx); err != nil {
			t.Fatal(err)
		}
		if n, _ := cr.Counts(); n != tt.renewals {
			t.Fatalf("call %d: %d renewals, want %d", i, n, tt.renewals)
		}
	}
}

// TestRenewOn401: credentials whose access token the relay refuses,
// though its expiry is far away, are renewed on the 401 and the call is
// made again once: the app sees success. Red without the retry in do.
func TestRenewOn401(t *testing.T) { forModes(t, testRenewOn401) }

func testRenewOn401(t *testing.T, mode pairtest.Mode) {
	clock := pairtest.NewClock()
	cr := pairtest.NewContractMode(t, mode, clock, time.Hour)
	store := &client.MemoryStore{}
	if _, err := client.Pair(context.Background(), cr.URL, cr.Invite("phone"), client.PairOptions{Store: store}); err != nil {
		t.Fatal(err)
	}
	creds, _ := store.Load(context.Background())
	creds.AccessToken = cr.Mint("other-household-device", -time.Hour) // refused: expired
	store.Save(context.Background(), creds)
	var st states
	c, _ := renewingClient(t, cr, store, client.WithStateFunc(st.add))
	if _, err := c.Register(context.Background()); err != nil {
		t.Fatalf("Register: %v", err)
	}
	if renewals, refused := cr.Counts(); renewals != 1 || refused != 1 {
		t.Fatalf("%d renewals, %d refusals; want one of each", renewals, refused)
	}
	if k := st.kinds(); !slices.Equal(k, []client.StateKind{client.StateConnected}) {
		t.Fatalf("states %v, want connected only", k)
	}
}

// TestRenewSingleFlight: eight calls that find the token due at once make
// one renewal and all use its token. The renewal is held at the relay
// until a second one arrives or 2 s pass, so that without the guard (each
// call renewing) a second one does arrive: red, 8 renewals (or 2 and
// refusals, from reuse detection).
func TestRenewSingleFlight(t *testing.T) { forModes(t, testRenewSingleFlight) }

func testRenewSingleFlight(t *testing.T, mode pairtest.Mode) {
	clock := pairtest.NewClock()
	cr := pairtest.NewContractMode(t, mode, clock, 2*time.Minute)
	c, src := paired(t, cr, "phone", &client.MemoryStore{})
	if _, err := c.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	clock.Advance(100 * time.Second)
	hold := make(chan struct{})
	cr.Mu.Lock()
	cr.Hold = hold
	cr.Mu.Unlock()
	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := c.Register(context.Background())
			errs <- err
		}()
	}
	<-cr.Renewed
	select {
	case <-cr.Renewed:
	case <-time.After(2 * time.Second):
	}
	close(hold)
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("Register: %v", err)
		}
	}
	if renewals, refused := cr.Counts(); renewals != 1 || refused != 0 {
		t.Fatalf("%d renewals, %d refusals; want 1 and 0", renewals, refused)
	}
	if src.Credentials().AccessExpiresAt != clock.Now().Add(2*time.Minute) {
		t.Fatalf("the source did not take the renewed credentials")
	}
}

// TestReplayedRenewalSecretRevokes: a copy of a device's first
// credentials, replayed by a second client after the first client used
// them (past the 30 s grace), is refused; reuse detection revokes the
// device's secrets, so the first client's next renewal is refused too and
// its listener reports unauthorized through the callback and stops with
// ErrUnauthorized. Red when a refused renewal is treated as passing (the
// listener retries forever, the test times out on its state).
func TestReplayedRenewalSecretRevokes(t *testing.T) { forModes(t, testReplayedRenewalSecretRevokes) }

func testReplayedRenewalSecretRevokes(t *testing.T, mode pairtest.Mode) {
	clock := pairtest.NewClock()
	cr := pairtest.NewContractMode(t, mode, clock, 2*time.Minute)
	store := &client.MemoryStore{}
	var st states
	unauth := make(chan struct{}, 10)
	streaming := make(chan struct{}, 10)
	phone, _ := paired(t, cr, "phone", store, client.WithWait(1), client.WithStateFunc(func(s client.State) {
		st.add(s)
		switch {
		case s.Kind == client.StateUnauthorized:
			unauth <- struct{}{}
		case s.Kind == client.StateConnected && s.Transport == client.TransportStream:
			streaming <- struct{}{}
		}
	}))
	first, _ := store.Load(context.Background())
	ctx := context.Background()
	clock.Advance(81 * time.Second)
	if _, err := phone.Register(ctx); err != nil { // renews: first's secret is used
		t.Fatal(err)
	}
	clock.Advance(31 * time.Second)

	copyStore := &client.MemoryStore{}
	copyStore.Save(ctx, first)
	var cst states
	thief, _ := renewingClient(t, cr, copyStore, client.WithStateFunc(cst.add))
	_, err := thief.Register(ctx)
	if !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("replayed secret: %v, want ErrUnauthorized", err)
	}
	if k := cst.kinds(); !slices.Equal(k, []client.StateKind{client.StateUnauthorized}) {
		t.Fatalf("replaying client's states %v", k)
	}

	done := make(chan error, 1)
	go func() {
		done <- phone.Listen(ctx, &client.MemoryCursor{}, func(context.Context, client.Envelope) error { return nil })
	}()
	select {
	case <-streaming:
	case <-time.After(10 * time.Second):
		t.Fatalf("no stream; states %v", st.kinds())
	}
	// The phone's renewal is due; its open stream notices at its next
	// event, ends, and renews as the next opens.
	clock.Advance(80 * time.Second)
	laptop, err := client.New(cr.URL, cr.Mint("laptop", time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := laptop.Send(ctx, "wake", []string{"phone"}, []byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-unauth:
	case <-time.After(10 * time.Second):
		t.Fatalf("no unauthorized state; states %v", st.kinds())
	}
	if err := <-done; !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("Listen: %v, want ErrUnauthorized", err)
	}
}

// TestRemovedDeviceUnauthorized: once an admin removes a paired device,
// its renewal is refused and the app hears unauthorized: its access
// token, issued before the removal, is refused too, so the first call
// after the removal renews, is refused, and fails with ErrUnauthorized.
func TestRemovedDeviceUnauthorized(t *testing.T) { forModes(t, testRemovedDeviceUnauthorized) }

func testRemovedDeviceUnauthorized(t *testing.T, mode pairtest.Mode) {
	clock := pairtest.NewClock()
	cr := pairtest.NewContractMode(t, mode, clock, 2*time.Minute)
	var st states
	phone, _ := paired(t, cr, "phone", &client.MemoryStore{}, client.WithStateFunc(st.add))
	ctx := context.Background()
	if _, err := phone.Register(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second) // the removal comes after the token's iat
	if err := cr.Remove("phone"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	_, err := phone.Register(ctx)
	if !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("Register after the removal: %v, want ErrUnauthorized", err)
	}
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 401 {
		t.Fatalf("Register after the removal: %v, want the relay's 401", err)
	}
	wantNextStep(t, "Register after the removal", err, "ask an admin for a new invitation and pair again")
	// Later calls fail with the same words, without asking the relay.
	_, err = phone.Register(ctx)
	wantNextStep(t, "the next Register", err, "ask an admin for a new invitation and pair again")
	if k := st.kinds(); k[len(k)-1] != client.StateUnauthorized {
		t.Fatalf("states %v", k)
	}

	// A listener, the case: it ends with the same next step.
	tablet, _ := paired(t, cr, "tablet", &client.MemoryStore{}, client.WithWait(1))
	if _, err := tablet.Register(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if err := cr.Remove("tablet"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err = tablet.Listen(lctx, &client.MemoryCursor{}, func(context.Context, client.Envelope) error { return nil })
	if !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("Listen after the removal: %v, want ErrUnauthorized", err)
	}
	wantNextStep(t, "Listen after the removal", err, "ask an admin for a new invitation and pair again")
}

// TestAckRefusedLogLine: a stream's lazy acknowledgement refused because
// its device was removed is logged with the refusal's own words last, so
// that the line ends with the step that helps. Seen red when the line
// ended "pair again (the next stream's cursor does)".
func TestAckRefusedLogLine(t *testing.T) { forModes(t, testAckRefusedLogLine) }

func testAckRefusedLogLine(t *testing.T, mode pairtest.Mode) {
	clock := pairtest.NewClock()
	cr := pairtest.NewContractMode(t, mode, clock, time.Hour)
	var (
		mu    sync.Mutex
		lines []string
	)
	logf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, fmt.Sprintf(format, args...))
	}
	phone, _ := paired(t, cr, "phone", &client.MemoryStore{}, client.WithLogf(logf))
	ctx := context.Background()
	if _, err := phone.Register(ctx); err != nil {
		t.Fatal(err)
	}
	laptop := newClient(t, cr.URL, cr.Mint("laptop", time.Hour))
	if _, err := laptop.Send(ctx, client.NewID(), []string{"phone"}, []byte("one")); err != nil {
		t.Fatal(err)
	}
	got, stop := listenInto(t, phone, &client.MemoryCursor{})
	expect(t, got, "one") // handed over, not yet acknowledged (ackEvery)
	clock.Advance(time.Second)
	if err := cr.Remove("phone"); err != nil {
		t.Fatal(err)
	}
	// The removal ends the stream, whose end acknowledges.
	var ack string
	for deadline := time.Now().Add(15 * time.Second); ack == "" && time.Now().Before(deadline); {
		mu.Lock()
		for _, l := range lines {
			if strings.Contains(l, "acknowledg") {
				ack = l
			}
		}
		mu.Unlock()
		time.Sleep(20 * time.Millisecond) // bounded poll of the listener's goroutine
	}
	_ = stop()
	const start, next = "listen: could not acknowledge 1 (the next stream's cursor will): ", "ask an admin for a new invitation and pair again"
	if !strings.HasPrefix(ack, start) || !strings.HasSuffix(ack, next) {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the acknowledgement's line %q does not start with %q and end with %q; all lines:\n%s", ack, start, next, strings.Join(lines, "\n"))
	}
}

// wantNextStep fails unless err's text ends with next, the step that
// helps: a refusal that only repeats the relay's words leaves the user
// guessing.
func wantNextStep(t *testing.T, what string, err error, next string) {
	t.Helper()
	if err == nil || !strings.HasSuffix(err.Error(), next) {
		t.Fatalf("%s: %v; want it to end with %q", what, err, next)
	}
}

// TestSaveBeforeUse: when the store cannot save a renewed set, the
// source does not take it: the token that still works is used meanwhile,
// the relay never sees the unsaved one, and once the old token has
// expired the call fails with the store's error. Red when the source
// takes the new set before saving it.
func TestSaveBeforeUse(t *testing.T) { forModes(t, testSaveBeforeUse) }

func testSaveBeforeUse(t *testing.T, mode pairtest.Mode) {
	clock := pairtest.NewClock()
	cr := pairtest.NewContractMode(t, mode, clock, 2*time.Minute)
	store := &checkedStore{}
	c, src := paired(t, cr, "phone", store)
	before := src.Credentials()
	clock.Advance(95 * time.Second)
	store.mu.Lock()
	store.fail = errors.New("disk full")
	store.mu.Unlock()
	if _, err := c.Register(context.Background()); err != nil {
		t.Fatalf("Register with the old token: %v", err)
	}
	// Past the old token's expiry, within the relay's 30 s grace for
	// renewing again with a secret whose answer was lost.
	clock.Advance(26 * time.Second)
	if _, err := c.Register(context.Background()); !errors.Is(err, store.fail) {
		t.Fatalf("Register: %v, want the store's error", err)
	}
	if renewals, _ := cr.Counts(); renewals != 2 || src.Credentials() != before {
		t.Fatalf("%d renewals; want 2, and the source to keep the credentials it could not replace", renewals)
	}
	cr.Mu.Lock()
	defer cr.Mu.Unlock()
	for _, b := range cr.Bearers {
		if b != before.AccessToken {
			t.Fatalf("the relay saw a token that was never saved")
		}
	}
}

// TestPairRefused: a wrong code is the relay's 401 and nothing is saved.
func TestPairRefused(t *testing.T) { forModes(t, testPairRefused) }

func testPairRefused(t *testing.T, mode pairtest.Mode) {
	cr := pairtest.NewContractMode(t, mode, pairtest.NewClock(), time.Hour)
	store := &client.MemoryStore{}
	_, err := client.Pair(context.Background(), cr.URL, "WRONG-CODE0", client.PairOptions{Store: store})
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 401 {
		t.Fatalf("Pair: %v, want a 401", err)
	}
	wantNextStep(t, "Pair with a wrong code", err, "ask an admin for a new invitation")
	if _, err := store.Load(context.Background()); !errors.Is(err, client.ErrNoCredentials) {
		t.Fatalf("store after a refusal: %v", err)
	}
}

// TestPairWithIdentityKey: the identity key given to Pair reaches the
// relay, which shows it to the inviting admin.
func TestPairWithIdentityKey(t *testing.T) { forModes(t, testPairWithIdentityKey) }

func testPairWithIdentityKey(t *testing.T, mode pairtest.Mode) {
	cr := pairtest.NewContractMode(t, mode, pairtest.NewClock(), time.Hour)
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Pair(context.Background(), cr.URL, cr.Invite("watch"), client.PairOptions{IdentityKey: pub})
	if err != nil {
		t.Fatal(err)
	}
	if c.Device != "watch" || c.Household != pairtest.Household || c.URL != cr.URL {
		t.Fatalf("paired as %+v", c)
	}
	if got, want := cr.IdentityKey("watch"), base64.StdEncoding.EncodeToString(pub); got != want {
		t.Fatalf("the relay holds identity key %q, want %q", got, want)
	}
}

// TestStaticTokenUnauthorized: a fixed token the relay refuses is the
// relay's 401 (a *Error that is also ErrUnauthorized), at once, and the
// unauthorized state.
func TestStaticTokenUnauthorized(t *testing.T) {
	var st states
	c := newClient(t, relayURL, "not-a-token", client.WithStateFunc(st.add))
	_, err := c.Register(context.Background())
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 401 || !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("Register: %v, want the relay's 401, ErrUnauthorized", err)
	}
	if k := st.kinds(); !slices.Equal(k, []client.StateKind{client.StateUnauthorized}) {
		t.Fatalf("states %v", k)
	}
}

// TestRetryingState: Send reports retrying with its delay while the relay
// cannot be reached.
func TestRetryingState(t *testing.T) {
	delays := make(chan time.Duration, 10)
	c := newClient(t, "http://127.0.0.1:1", "tok", client.WithMaxBackoff(10*time.Millisecond), client.WithStateFunc(func(s client.State) {
		if s.Kind == client.StateRetrying {
			delays <- s.Delay
		}
	}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Send(ctx, "x", []string{"a"}, []byte("p"))
	for range 2 {
		select {
		case d := <-delays:
			if d <= 0 {
				t.Fatalf("retrying with delay %v", d)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no retrying state")
		}
	}
}

// TestFileStore: the file is JSON, 0600, replaced whole (no temporary
// file left), and a missing file is ErrNoCredentials.
func TestFileStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "creds.json")
	fs := client.FileStore(path)
	ctx := context.Background()
	if _, err := fs.Load(ctx); !errors.Is(err, client.ErrNoCredentials) {
		t.Fatalf("Load of no file: %v", err)
	}
	want := client.Credentials{URL: "http://r", Household: "home", Device: "phone", Scope: "device", AccessToken: "a.b.c",
		AccessExpiresAt: time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC), RenewalSecret: "fnr1.x", RenewalExpiresAt: time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)}
	for range 2 {
		if err := fs.Save(ctx, want); err != nil {
			t.Fatal(err)
		}
	}
	got, err := fs.Load(ctx)
	if err != nil || got != want {
		t.Fatalf("Load: %+v %v, want %+v", got, err, want)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("directory holds %d files, want 1", len(entries))
	}
	b, _ := os.ReadFile(path)
	for _, key := range []string{`"access_token": "a.b.c"`, `"renewal_secret": "fnr1.x"`, `"access_expires_at": "2026-12-01T18:00:00Z"`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("file lacks %s:\n%s", key, b)
		}
	}
}

// forModes runs test once with pair and renew answered by the test's own
// server (the contract as written) and once by the relay's own endpoints.
func forModes(t *testing.T, test func(*testing.T, pairtest.Mode)) {
	for _, m := range pairtest.Modes() {
		t.Run(string(m), func(t *testing.T) { test(t, m) })
	}
}

// TestSharedFileStore: two holders of one credentials file (two processes
// of one device; here two sources, each with its own file descriptors, so
// the kernel's lock is as between processes) renew in turn for five
// rounds, each finding its set due: the second takes up the set the
// first saved instead of presenting the spent secret, which the relay
// would take as reuse and answer by revoking the device's every secret.
// Then they renew at once, five rounds more. Every call succeeds, and
// there is one renewal a round. Red without the reading under the lock,
// and without the lock.
func TestSharedFileStore(t *testing.T) {
	clock := pairtest.NewClock()
	cr := pairtest.NewContractMode(t, pairtest.Real, clock, 2*time.Minute)
	store := client.FileStore(filepath.Join(t.TempDir(), "phone.json"))
	ctx := context.Background()
	if _, err := client.Pair(ctx, cr.URL, cr.Invite("phone"), client.PairOptions{Store: store}); err != nil {
		t.Fatal(err)
	}
	a, _ := renewingClient(t, cr, store)
	b, srcB := renewingClient(t, cr, client.FileStore(string(store)))
	const rounds = 5
	for round := range rounds {
		clock.Advance(81 * time.Second) // both sets are due
		first, second := a, b
		if round%2 == 1 {
			first, second = b, a
		}
		if _, err := first.Register(ctx); err != nil {
			t.Fatalf("round %d, first holder: %v", round, err)
		}
		if _, err := second.Register(ctx); err != nil {
			t.Fatalf("round %d, second holder: %v", round, err)
		}
	}
	// And at once: the lock lets one renew while the other waits, then
	// reads what it saved.
	for round := range rounds {
		clock.Advance(81 * time.Second)
		errs := make(chan error, 2)
		for _, c := range []*client.Client{a, b} {
			go func() {
				_, err := c.Register(ctx)
				errs <- err
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("concurrent round %d: %v", round, err)
			}
		}
	}
	if renewals, refused := cr.Counts(); renewals != 2*rounds || refused != 0 {
		t.Fatalf("%d renewals and %d refusals, want %d and 0", renewals, refused, 2*rounds)
	}
	saved, err := store.Load(ctx)
	if err != nil || saved.RenewalSecret != srcB.Credentials().RenewalSecret {
		t.Fatalf("the file holds another set than the holders use: %v", err)
	}
}
