package relay

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/store/sqlite"
	"github.com/flamenet/relay/token"
	"github.com/flamenet/relay/wake"
	"github.com/flamenet/relay/wake/local"
)

// freshToken is a token for household/device issued after anything that
// happened so far (iat has whole seconds).
func freshToken(h *harness, household, device string) string {
	h.t.Helper()
	return h.mint(token.Claims{Household: household, Device: device, IssuedAt: time.Now().Add(time.Second), Expires: time.Now().Add(time.Hour)})
}

// TestRemovalSticksWithRedisPaused: a device is removed through relay A
// while Redis is paused, so relay B has not heard of it; the device's old
// token, polling through B, is refused 401 and registers nothing: the
// device stays removed, and sends to it answer 404. B's memory says the
// token is good; the store's check in the statement that would register
// the device decides.
//
// Two checks guard this: the life the store read, which the poll checks
// before it acknowledges anything, and the store's own condition in the
// statement that would register the device; TestRemovalBetweenReadAndCreate
// is the race only the second can catch.
func TestRemovalSticksWithRedisPaused(t *testing.T) {
	rs := servicetest.StartRedis(t)
	a, b := fleetReplicas(t, rs.URL(), rs.URL())
	old := a.register("home", "phone")
	laptop := a.register("home", "laptop")
	admin := a.mint(token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})

	rs.Pause()
	paused := true
	defer func() {
		if paused {
			rs.Resume()
		}
	}()
	a.must("DELETE", "/v1/devices/phone", admin, nil, http.StatusNoContent)
	if life, _ := b.srv.memory.KnownLife(device.Key{Household: "home", Device: "phone"}); !life.IsZero() {
		t.Fatal("B heard of the removal with Redis paused; the test proves nothing")
	}
	for _, path := range []string{"/v1/poll?cursor=0&wait=0", "/v1/poll?wait=0"} {
		if r := b.must("GET", path, old, nil, http.StatusUnauthorized); r.errCode(t) != codeUnauthorized {
			t.Fatalf("GET %s with the old token: %s", path, r.body)
		}
	}
	b.must("POST", "/v1/ack", old, map[string]any{"cursor": 0}, http.StatusUnauthorized)
	b.must("POST", "/v1/register", old, nil, http.StatusUnauthorized)
	rs.Resume()
	paused = false

	var dir devicesResponse
	a.must("GET", "/v1/devices", laptop, nil, http.StatusOK).json(t, &dir)
	for _, d := range dir.Devices {
		if d.Device == "phone" {
			t.Fatalf("the removed device is listed again: %+v", dir.Devices)
		}
	}
	r := a.must("POST", "/v1/send", laptop, map[string]any{"id": "after", "to": []string{"phone"}, "payload": []byte("x")}, http.StatusNotFound)
	if code := r.errCode(t); code != codeUnknownDevice {
		t.Fatalf("a send to the removed device: %s", r.body)
	}
}

// ackHook runs before the first implicit registration (Ack) it sees.
type ackHook struct {
	store.Store
	once   sync.Once
	before func()
}

func (s *ackHook) Ack(ctx context.Context, p store.AckParams) (store.Position, error) {
	s.once.Do(s.before)
	return s.Store.Ack(ctx, p)
}

// TestRemovalBetweenReadAndCreate: relay B reads that "phone" does not
// exist, for a poll with a token issued before any removal; then, before B
// registers it, the device is registered with another token and removed
// through relay A. B's implicit registration must be refused (401), and the
// device stay removed: only the store, in the statement that would
// register the device, can tell.
//
// Broken on purpose once (the removal condition taken out of SQLite's
// implicit registration, its insert and the read after it), this test
// failed: B answered 200 to the old token.
func TestRemovalBetweenReadAndCreate(t *testing.T) {
	db, err := sqlite.Open(context.Background(), sqlite.Config{Path: filepath.Join(t.TempDir(), "relay.db"), Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	hook := &ackHook{Store: db}
	a := newHarnessWith(t, Deps{Store: db, Hub: local.New(nil)}, nil)
	b := newHarnessWith(t, Deps{Store: hook, Hub: local.New(nil)}, nil)
	b.key, b.srv.keys = a.key, a.srv.keys

	old := b.token("home", "phone") // issued before the removal below
	laptop := a.register("home", "laptop")
	admin := a.mint(token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
	hook.before = func() {
		a.must("POST", "/v1/register", freshToken(a, "home", "phone"), nil, http.StatusOK)
		a.must("DELETE", "/v1/devices/phone", admin, nil, http.StatusNoContent)
	}
	b.must("GET", "/v1/poll?cursor=0&wait=0", old, nil, http.StatusUnauthorized)

	var dir devicesResponse
	a.must("GET", "/v1/devices", laptop, nil, http.StatusOK).json(t, &dir)
	if len(dir.Devices) != 1 || dir.Devices[0].Device != "laptop" {
		t.Fatalf("after the removal the directory lists %+v, want laptop alone", dir.Devices)
	}
}

// TestNewLifeAfterRacingRemoval races sends through relay A against the
// recipient's removal through relay B, then registers the name again and
// checks that the new life's poll on B gets its own seq 1 at once: a wake
// of the earlier life that B hears after the removal must not leave its
// head behind in B's memory. "paused wake" makes the late wake certain:
// A's send commits, its wake waits until B has removed the device.
//
// Broken on purpose once (the life check in position.Cache.Advanced
// removed), "paused wake" failed in its first round: the new life's held
// poll answered empty after its whole wait, the send's envelope never
// handed over.
func TestNewLifeAfterRacingRemoval(t *testing.T) {
	t.Run("race", func(t *testing.T) {
		a, b := replicas(t, servicetest.RedisURL(t), 2)
		newLives(t, a, b, 15, 30)
	})
	t.Run("paused wake", func(t *testing.T) {
		a, b := replicas(t, servicetest.RedisURL(t), 2)
		var (
			mu      sync.Mutex
			hold    chan struct{} // closed once B removed the device
			reached chan struct{} // closed when a send's wake is held
		)
		a.srv.hooks.beforeWake = func([]wake.Wake) {
			mu.Lock()
			h, r := hold, reached
			hold, reached = nil, nil
			mu.Unlock()
			if h != nil {
				close(r)
				<-h
			}
		}
		arm := func() (held, release chan struct{}) {
			mu.Lock()
			defer mu.Unlock()
			hold, reached = make(chan struct{}), make(chan struct{})
			return reached, hold
		}
		newLivesWith(t, a, b, 3, 1, arm)
	})
}

// newLives runs rounds of sends racing a removal, each followed by a new
// life of the device.
func newLives(t *testing.T, a, b *harness, rounds, sends int) {
	newLivesWith(t, a, b, rounds, sends, nil)
}

// newLivesWith is newLives; arm, when not nil, holds the next send's wake
// until release is closed, and tells when the wake is held.
func newLivesWith(t *testing.T, a, b *harness, rounds, sends int, arm func() (held, release chan struct{})) {
	t.Helper()
	laptop := a.register("home", "laptop")
	admin := b.mint(token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
	phone := freshToken(b, "home", "phone")
	b.must("POST", "/v1/register", phone, nil, http.StatusOK)
	for round := range rounds {
		// B knows the device: its polls are what the late wake would
		// corrupt.
		b.poll(phone, "cursor=0&wait=0")

		var held, release chan struct{}
		if arm != nil {
			held, release = arm()
		}
		var wg sync.WaitGroup
		for i := range sends {
			wg.Go(func() {
				body := map[string]any{"id": fmt.Sprintf("r%d-%d", round, i), "to": []string{"phone"}, "payload": []byte("old life")}
				r, err := a.do(t.Context(), "POST", "/v1/send", laptop, body)
				if err != nil || (r.status != http.StatusAccepted && r.status != http.StatusNotFound) {
					t.Errorf("send racing the removal: %v %d %s", err, r.status, r.body)
				}
			})
		}
		if held != nil {
			<-held
		}
		b.must("DELETE", "/v1/devices/phone", admin, nil, http.StatusNoContent)
		if release != nil {
			close(release)
		}
		wg.Wait()

		phone = freshToken(b, "home", "phone")
		b.must("POST", "/v1/register", phone, nil, http.StatusOK)
		poll := heldPoll(b, phone, "cursor=0&wait=5")
		eventually(t, "the new life's poll held", func() bool { return b.srv.HeldPolls() == 1 })
		id := fmt.Sprint("new", round)
		if res := a.send(laptop, id, []byte("new life"), "phone"); res.Deliveries[0].Seq != 1 {
			t.Fatalf("round %d: the new life's first send got seq %d", round, res.Deliveries[0].Seq)
		}
		if p := <-poll; len(p.Envelopes) != 1 || p.Envelopes[0].ID != id || p.Envelopes[0].Seq != 1 {
			t.Fatalf("round %d: the new life's poll = %+v, want %s at seq 1", round, p, id)
		}
		if r := b.must("GET", "/v1/poll?cursor=3&wait=0", phone, nil, http.StatusConflict); r.errCode(t) != codeCursorAhead {
			t.Fatalf("round %d: a cursor above the new life's head: %s", round, r.body)
		}
		b.poll(phone, "cursor=1&wait=0") // acknowledged: the next round starts clean
	}
}
