package relay

import (
	"net/http"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/token"
)

// TestVerifiedTokenExpires: a token remembered as verified is refused once
// it expires, like any other (dropping the expiry check from the cache's
// get turns this red, which was tried).
func TestVerifiedTokenExpires(t *testing.T) {
	h := newHarness(t, nil)
	now := time.Now()
	h.srv.now = func() time.Time { return now }
	tok := h.mint(token.Claims{Household: "home", Device: "phone", IssuedAt: now, Expires: now.Add(time.Minute)})
	h.must("POST", "/v1/register", tok, nil, http.StatusOK)
	now = now.Add(time.Minute + token.Skew + time.Second)
	if got := h.must("GET", "/v1/poll", tok, nil, http.StatusUnauthorized).errCode(t); got != codeUnauthorized {
		t.Fatalf("code = %s", got)
	}
}

// TestRemovalReachesOtherReplicas: a removal made through one relay
// refuses the device's old token on another relay at once: the news
// travels with the wake-ups, and no relay asks the store on every request.
func TestRemovalReachesOtherReplicas(t *testing.T) {
	a, b := replicas(t, servicetest.RedisURL(t), 8)
	phone := a.register("home", "phone")
	b.must("GET", "/v1/poll", phone, nil, http.StatusOK) // b now remembers "not removed"
	admin := a.mint(token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
	a.must("DELETE", "/v1/devices/phone", admin, nil, http.StatusNoContent)
	a.must("GET", "/v1/poll", phone, nil, http.StatusUnauthorized)
	eventually(t, "the other relay refusing the removed device's token", func() bool {
		r, err := b.do(t.Context(), "GET", "/v1/poll", phone, nil)
		return err == nil && r.status == http.StatusUnauthorized
	})
}
