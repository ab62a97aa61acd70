package relay

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/token"
)

var tablet = device.Key{Household: "home", Device: "tablet"}

// removeTablet registers home/tablet on h and removes it; it returns a
// token of the tablet's issued before the removal.
func removeTablet(t *testing.T, h *harness) string {
	t.Helper()
	old := h.register("home", "tablet")
	admin := h.mint(token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
	h.must("DELETE", "/v1/devices/tablet", admin, nil, http.StatusNoContent)
	return old
}

// listed waits until h's list of removals is read and returns the
// tablet's removal from it.
func listed(t *testing.T, h *harness) time.Time {
	t.Helper()
	var at time.Time
	eventually(t, "the list of removals read", func() bool {
		life, ok := h.srv.memory.Listed(tablet)
		at = life.RemovedAt()
		return ok
	})
	return at
}

// TestFirstRequestsReadNoRemoval: a relay started over a store in which a
// device was removed knows it from the list it read at start. A sender it
// never met sends, and the removed device's old token is refused, without
// a store read for either. With removedAt ignoring the list, this goes red
// (tried): two state reads.
func TestFirstRequestsReadNoRemoval(t *testing.T) {
	a := newHarness(t, nil)
	a.register("home", "phone")
	old := removeTablet(t, a)

	b := newHarnessWith(t, Deps{Store: a.db, Hub: newLocalHub()}, nil)
	b.key, b.srv.keys = a.key, a.srv.keys
	if at := listed(t, b); at.IsZero() {
		t.Fatal("the list read at start lacks the tablet's removal")
	}
	states := func() float64 { return testutil.ToFloat64(b.srv.metrics.storeCalls.WithLabelValues("state")) }
	before := states()
	laptop := b.token("home", "laptop") // never registered: a sender need not be
	b.must("POST", "/v1/send", laptop, map[string]any{"id": "1", "to": []string{"phone"}, "payload": []byte("x")}, http.StatusAccepted)
	if code := b.must("POST", "/v1/send", old, map[string]any{"id": "2", "to": []string{"phone"}, "payload": []byte("x")}, http.StatusUnauthorized).errCode(t); code != codeUnauthorized {
		t.Fatalf("removed device's old token: code %s", code)
	}
	if d := states() - before; d != 0 {
		t.Errorf("first requests of two devices this relay never met made %v store state reads, want none", d)
	}
}

// removalDuringRead commits a removal, and tells the hub of it as the
// relay that made it would, right after the list of removals was read:
// the read's snapshot does not have it.
type removalDuringRead struct {
	store.Store
	once   *sync.Once
	during func()
}

func (s removalDuringRead) Removals(ctx context.Context, limit int) ([]store.Removal, error) {
	rs, err := s.Store.Removals(ctx, limit)
	s.once.Do(s.during)
	return rs, err
}

// TestRemovalsHeardDuringRead: a removal committed after the list's read
// and heard while it is in flight is in the list once it is complete. The
// list is read only once the hub has the relay's observer, which forwards
// removals to it; without that forwarding, this goes red (tried).
func TestRemovalsHeardDuringRead(t *testing.T) {
	a := newHarness(t, nil)
	old := a.register("home", "tablet")
	at := time.Now().UTC().Truncate(time.Microsecond)
	hub := newLocalHub()
	st := removalDuringRead{Store: a.db, once: &sync.Once{}, during: func() {
		if err := a.db.DeleteDevice(context.Background(), "home", "tablet", at); err != nil {
			t.Errorf("DeleteDevice: %v", err)
		}
		if err := hub.Remove(context.Background(), tablet, at); err != nil {
			t.Errorf("Remove: %v", err)
		}
	}}
	b := newHarnessWith(t, Deps{Store: st, Hub: hub}, nil)
	b.key, b.srv.keys = a.key, a.srv.keys
	if got := listed(t, b); !got.Equal(at) {
		t.Fatalf("list has the tablet removed at %v, want %v", got, at)
	}
	b.must("GET", "/v1/poll", old, nil, http.StatusUnauthorized)
}
