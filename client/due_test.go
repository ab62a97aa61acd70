package client_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
)

// TestRenewingDue: a token is due from its renewal lead on; after a
// renewal that failed for a passing reason it is not due again until the
// pause is over, so that a stream (which Listen opens again when its token
// is due) does not reconnect at every event while the relay cannot renew.
// Red without the pause in Due: Listen would spin on a 503.
func TestRenewingDue(t *testing.T) {
	var renewals atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		renewals.Add(1)
		http.Error(w, `{"error":"unavailable","message":"down"}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	now := time.Now()
	clock := func() time.Time { return now }
	store := &client.MemoryStore{}
	ctx := context.Background()
	// A token of 2 minutes: the client reads its iat and exp to plan.
	claims := fmt.Sprintf(`{"iat":%d,"exp":%d}`, now.Unix(), now.Add(2*time.Minute).Unix())
	tok := "e30." + base64.RawURLEncoding.EncodeToString([]byte(claims)) + ".sig"
	if err := store.Save(ctx, client.Credentials{Household: "home", Device: "phone", Scope: "device",
		AccessToken: tok, AccessExpiresAt: now.Add(2 * time.Minute),
		RenewalSecret: "secret", RenewalExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	r, err := client.NewRenewing(ctx, srv.URL, store, client.RenewingOptions{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if r.Due() {
		t.Fatal("due with 2 of a token's minutes left")
	}
	now = now.Add(81 * time.Second) // under a third of its life left
	if !r.Due() {
		t.Fatal("not due with 39 s of 2 minutes left")
	}
	if got, err := r.Token(ctx); err != nil || got != tok {
		t.Fatalf("Token after a failed renewal: %q, %v; want the token that still works", got, err)
	}
	if renewals.Load() != 1 {
		t.Fatalf("%d renewals, want 1", renewals.Load())
	}
	if r.Due() {
		t.Fatal("due again right after a renewal failed: a stream would reconnect at every event")
	}
	now = now.Add(30 * time.Second)
	if !r.Due() {
		t.Fatal("still not due once the pause after the failure is over")
	}
}
