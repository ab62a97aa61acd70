package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
)

// grace is the retry grace the suite renews with, as the relay does.
const grace = 30 * time.Second

func refusedFor(t testing.TB, err error, reason, what string) {
	t.Helper()
	var re *store.RefusedError
	if !errors.As(err, &re) || !errors.Is(err, store.ErrRefused) {
		t.Fatalf("%s: %v, want a refusal (%s)", what, err, reason)
	}
	if re.Reason != reason {
		t.Fatalf("%s: refused as %q, want %q", what, re.Reason, reason)
	}
}

func invite(t testing.TB, s store.Store, device, code string, now time.Time) {
	t.Helper()
	inviteWith(t, s, store.InviteParams{Device: device}, code, now)
}

// inviteWith invites p.Device as p says, with the suite's defaults.
func inviteWith(t testing.TB, s store.Store, p store.InviteParams, code string, now time.Time) {
	t.Helper()
	p.Household, p.Code, p.Now, p.Expires = hh, store.HashSecret(code), now, now.Add(10*time.Minute)
	if p.Scope == "" {
		p.Scope = "device"
	}
	if err := s.CreateInvitation(ctx(t), p); err != nil {
		t.Fatalf("CreateInvitation(%s): %v", p.Device, err)
	}
}

func pairParams(code, secret string, now time.Time) store.PairParams {
	return store.PairParams{Code: store.HashSecret(code), Now: now, Secret: store.HashSecret(secret), SecretExpires: now.Add(90 * 24 * time.Hour)}
}

func renewParams(secret, next string, now time.Time) store.RenewParams {
	return store.RenewParams{Secret: store.HashSecret(secret), NewSecret: store.HashSecret(next), Now: now,
		SecretExpires: now.Add(90 * 24 * time.Hour), Grace: grace}
}

func pairOK(t testing.TB, s store.Store, code, secret string, now time.Time) store.Grant {
	t.Helper()
	g, err := s.Pair(ctx(t), pairParams(code, secret, now))
	if err != nil {
		t.Fatalf("Pair(%s): %v", code, err)
	}
	return g
}

func renewOK(t testing.TB, s store.Store, secret, next string, now time.Time) store.Grant {
	t.Helper()
	g, err := s.Renew(ctx(t), renewParams(secret, next, now))
	if err != nil {
		t.Fatalf("Renew(%s -> %s): %v", secret, next, err)
	}
	return g
}

// testPair: redeeming registers the device, once, before expiry; a wrong
// code changes nothing.
func testPair(t *testing.T, open Opener) {
	s := fresh(t, open)
	key := []byte("0123456789abcdef0123456789abcdef")
	if err := s.CreateInvitation(ctx(t), store.InviteParams{Household: hh, Device: "phone", Scope: "admin",
		Code: store.HashSecret("CODE1"), Now: t0, Expires: t0.Add(10 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	_, err := s.Pair(ctx(t), pairParams("CODE2", "s0", t0))
	refusedFor(t, err, store.RefusedUnknown, "a code never issued")
	if ds := listAll(t, s, hh); len(ds) != 0 {
		t.Fatalf("a refused pairing registered %v", names(ds))
	}

	p := pairParams("CODE1", "s1", t0.Add(time.Minute))
	p.IdentityKey = key
	p.Scope = "admin"
	g, err := s.Pair(ctx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	if want := (store.Grant{Household: hh, Device: "phone", Scope: "admin"}); g != want {
		t.Fatalf("Pair = %+v, want %+v", g, want)
	}
	ds := listAll(t, s, hh)
	if len(ds) != 1 || ds[0].Name != "phone" || string(ds[0].IdentityKey) != string(key) {
		t.Fatalf("after pairing the directory holds %+v, want phone with its key", ds)
	}
	// Single use: the same code again is refused, and stores no secret.
	_, err = s.Pair(ctx(t), pairParams("CODE1", "s2", t0.Add(2*time.Minute)))
	refusedFor(t, err, store.RefusedUsed, "a used code")
	_, err = s.Renew(ctx(t), renewParams("s2", "s3", t0.Add(3*time.Minute)))
	refusedFor(t, err, store.RefusedUnknown, "the secret of a refused pairing")
	// The pairing's own secret renews.
	if g := renewOK(t, s, "s1", "s4", t0.Add(3*time.Minute)); g.Scope != "admin" || g.Device != "phone" {
		t.Fatalf("Renew = %+v, want phone's admin grant", g)
	}

	// Expiry: at the expiry's microsecond and after, refused.
	invite(t, s, "tablet", "CODE3", t0)
	_, err = s.Pair(ctx(t), pairParams("CODE3", "s5", t0.Add(10*time.Minute)))
	refusedFor(t, err, store.RefusedExpired, "a code at its expiry")
	if st := state(t, s, hh, "tablet"); st.Exists {
		t.Fatal("an expired code registered its device")
	}
	g = pairOK(t, s, "CODE3", "s5", t0.Add(10*time.Minute-time.Microsecond))
	if g.Device != "tablet" || g.Scope != "device" {
		t.Fatalf("Pair = %+v, want tablet's device grant", g)
	}
	// A code of another scope than the caller can use is refused and
	// stays unspent (a console pairs only admin devices).
	invite(t, s, "kettle", "CODE9", t0)
	wrong := pairParams("CODE9", "s9", t0.Add(time.Minute))
	wrong.Scope = "admin"
	_, err = s.Pair(ctx(t), wrong)
	refusedFor(t, err, store.RefusedScope, "a device's code asked for as an admin's")
	if g, err := s.Pair(ctx(t), pairParams("CODE9", "s10", t0.Add(time.Minute))); err != nil || g.Device != "kettle" {
		t.Fatalf("the code refused for its scope, redeemed: %+v, %v; want it unspent", g, err)
	}
}

// testInvitations: a new invitation replaces the device's unredeemed one;
// the list shows pending and recently redeemed ones, with the redeeming
// device's key.
func testInvitations(t *testing.T, open Opener) {
	s := fresh(t, open)
	invite(t, s, "phone", "OLD", t0)
	invite(t, s, "phone", "NEW", t0.Add(time.Second))
	_, err := s.Pair(ctx(t), pairParams("OLD", "s0", t0.Add(2*time.Second)))
	refusedFor(t, err, store.RefusedUnknown, "a replaced code")
	invite(t, s, "laptop", "LAP", t0)
	invite(t, s, "old", "GONE", t0.Add(-time.Hour)) // expired by t0
	key := []byte("0123456789abcdef0123456789abcdef")
	p := pairParams("NEW", "s1", t0.Add(3*time.Second))
	p.IdentityKey = key
	if _, err := s.Pair(ctx(t), p); err != nil {
		t.Fatal(err)
	}
	// A new invitation for a device whose last one was redeemed (one that
	// replaces it, the device being paired) leaves the redeemed one listed.
	inviteWith(t, s, store.InviteParams{Device: "phone", Replace: true}, "AGAIN", t0.Add(4*time.Second))

	list := func(now time.Time) string {
		t.Helper()
		ins, err := s.Invitations(ctx(t), store.InvitationsParams{Household: hh, Now: now, RedeemedSince: now.Add(-24 * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		out := ""
		for _, in := range ins {
			out += fmt.Sprintf("%s/%s/%v/%s;", in.Device, in.Scope, !in.RedeemedAt.IsZero(), in.IdentityKey)
			if in.Household != hh || in.ExpiresAt.IsZero() || in.CreatedAt.IsZero() {
				t.Errorf("invitation %+v lacks its household or times", in)
			}
		}
		return out
	}
	if got, want := list(t0.Add(5*time.Second)), "laptop/device/false/;phone/device/true/"+string(key)+";phone/device/false/;"; got != want {
		t.Errorf("Invitations = %q, want %q", got, want)
	}
	// A day on, the redeemed one is no longer listed, and the pending
	// ones have expired.
	if got := list(t0.Add(24*time.Hour + 4*time.Second)); got != "" {
		t.Errorf("Invitations a day later = %q, want none", got)
	}
	other, err := s.Invitations(ctx(t), store.InvitationsParams{Household: "elsewhere", Now: t0, RedeemedSince: t0.Add(-time.Hour)})
	if err != nil || len(other) != 0 {
		t.Errorf("another household's invitations = %v, %v", other, err)
	}
}

// testRenew: rotation, reuse detection and the one retry the grace allows.
func testRenew(t *testing.T, open Opener) {
	s := fresh(t, open)
	invite(t, s, "phone", "C", t0)
	pairOK(t, s, "C", "s1", t0)
	renewOK(t, s, "s1", "s2", t0.Add(time.Hour))

	// A retry of s1 within the grace, s2 unused: s2 is revoked and s3
	// issued in its place.
	renewOK(t, s, "s1", "s3", t0.Add(time.Hour+29*time.Second))
	renewOK(t, s, "s3", "s4", t0.Add(2*time.Hour))
	// The secret the retry replaced is revoked, and presenting it revokes
	// every secret of the device, s4 included.
	_, err := s.Renew(ctx(t), renewParams("s2", "x", t0.Add(2*time.Hour)))
	refusedFor(t, err, store.RefusedRevoked, "the secret a retry replaced")
	_, err = s.Renew(ctx(t), renewParams("s4", "x", t0.Add(2*time.Hour)))
	refusedFor(t, err, store.RefusedRevoked, "the device's live secret after a revoked one was presented")

	// A secret is retried once: a second retry within the grace, its
	// successor unused, is reuse, and revokes the device's secrets.
	invite(t, s, "laptop", "L", t0)
	pairOK(t, s, "L", "l1", t0)
	renewOK(t, s, "l1", "l2", t0.Add(time.Hour))
	renewOK(t, s, "l1", "l3", t0.Add(time.Hour+time.Second))
	_, err = s.Renew(ctx(t), renewParams("l1", "l4", t0.Add(time.Hour+2*time.Second)))
	refusedFor(t, err, store.RefusedReused, "a second retry")
	_, err = s.Renew(ctx(t), renewParams("l3", "x", t0.Add(time.Hour+3*time.Second)))
	refusedFor(t, err, store.RefusedRevoked, "the first retry's secret after a second retry")

	// A used secret whose successor was used, inside the grace of its own
	// use, is reuse.
	invite(t, s, "desk", "D", t0)
	pairOK(t, s, "D", "d1", t0)
	renewOK(t, s, "d1", "d2", t0.Add(time.Hour))
	renewOK(t, s, "d2", "d3", t0.Add(time.Hour+time.Second))
	_, err = s.Renew(ctx(t), renewParams("d1", "x", t0.Add(time.Hour+2*time.Second)))
	refusedFor(t, err, store.RefusedReused, "a secret whose successor was used")
	_, err = s.Renew(ctx(t), renewParams("d3", "x", t0.Add(time.Hour+3*time.Second)))
	refusedFor(t, err, store.RefusedRevoked, "the device's live secret after reuse")

	// Reuse after the grace, the successor unused, revokes too, and only
	// the device's own secrets.
	invite(t, s, "other", "O", t0)
	pairOK(t, s, "O", "o1", t0)
	invite(t, s, "tablet", "T", t0)
	pairOK(t, s, "T", "t1", t0)
	renewOK(t, s, "t1", "t2", t0.Add(time.Hour))
	_, err = s.Renew(ctx(t), renewParams("t1", "x", t0.Add(time.Hour+grace)))
	refusedFor(t, err, store.RefusedReused, "a used secret after the grace")
	_, err = s.Renew(ctx(t), renewParams("t2", "x", t0.Add(time.Hour+grace)))
	refusedFor(t, err, store.RefusedRevoked, "the successor after reuse")
	renewOK(t, s, "o1", "o2", t0.Add(time.Hour+grace))

	// Unknown and expired.
	_, err = s.Renew(ctx(t), renewParams("never", "x", t0))
	refusedFor(t, err, store.RefusedUnknown, "a secret never issued")
	invite(t, s, "watch", "W", t0)
	pairOK(t, s, "W", "w1", t0)
	_, err = s.Renew(ctx(t), renewParams("w1", "x", t0.Add(90*24*time.Hour)))
	refusedFor(t, err, store.RefusedExpired, "a secret at its expiry")
	renewOK(t, s, "w1", "w2", t0.Add(90*24*time.Hour-time.Microsecond))
}

// testPairingRemoval: a removal revokes the device's invitations and
// secrets; an invitation or secret of the life before it is refused even
// if it survived it, and an invitation made after it works.
func testPairingRemoval(t *testing.T, open Opener) {
	s := fresh(t, open)
	invite(t, s, "phone", "C1", t0)
	pairOK(t, s, "C1", "s1", t0.Add(time.Second))
	inviteWith(t, s, store.InviteParams{Device: "phone", Replace: true}, "C2", t0.Add(2*time.Second)) // pending when removed
	removed := t0.Add(time.Minute)
	if err := s.DeleteDevice(ctx(t), hh, "phone", removed); err != nil {
		t.Fatal(err)
	}
	_, err := s.Renew(ctx(t), renewParams("s1", "x", removed.Add(time.Second)))
	refusedFor(t, err, store.RefusedUnknown, "a removed device's renewal secret")
	_, err = s.Pair(ctx(t), pairParams("C2", "x", removed.Add(time.Second)))
	refusedFor(t, err, store.RefusedUnknown, "a removed device's pending invitation")

	// An invitation created at or before the removal (one that raced it)
	// is refused by the removal itself, not only by the deletion.
	for _, at := range []time.Time{removed.Add(-time.Second), removed} {
		invite(t, s, "phone", "RACE", at)
		_, err = s.Pair(ctx(t), pairParams("RACE", "x", removed.Add(2*time.Second)))
		refusedFor(t, err, store.RefusedRemoved, fmt.Sprintf("an invitation created at %v, device removed at %v", at, removed))
		if st := state(t, s, hh, "phone"); st.Exists {
			t.Fatal("an invitation of the earlier life registered the device again")
		}
	}

	// After the removal: a new life.
	after := removed.Add(time.Microsecond)
	invite(t, s, "phone", "C3", after)
	pairOK(t, s, "C3", "n1", after.Add(time.Second))
	renewOK(t, s, "n1", "n2", after.Add(time.Hour))

	// A secret issued at or before a later removal, surviving it, is
	// refused by the removal itself. (A store forgets secrets when it
	// removes; this is the check behind that.)
	again := after.Add(2 * time.Hour)
	if err := s.DeleteDevice(ctx(t), hh, "phone", again); err != nil {
		t.Fatal(err)
	}
	invite(t, s, "phone", "C4", again.Add(-time.Second)) // created before the removal, stored after it
	_, err = s.Pair(ctx(t), pairParams("C4", "x", again.Add(time.Second)))
	refusedFor(t, err, store.RefusedRemoved, "an invitation stored after the removal it predates")
}

// testConcurrentRenewals: renewals of one secret at once run one after
// the other. Without a grace exactly one succeeds (and the others, reuse,
// revoke what it got); with the grace at most two do (a use and its one
// retry), and the third is reuse, which revokes them all.
func testConcurrentRenewals(t *testing.T, open Opener) {
	const n = 8
	for _, g := range []time.Duration{0, grace} {
		t.Run(fmt.Sprintf("grace=%v", g), func(t *testing.T) {
			s := fresh(t, open)
			invite(t, s, "phone", "C", t0)
			pairOK(t, s, "C", "s0", t0)
			var (
				wg    sync.WaitGroup
				start = make(chan struct{})
				errs  = make([]error, n)
			)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					p := renewParams("s0", fmt.Sprint("next", i), t0.Add(time.Minute))
					p.Grace = g
					_, errs[i] = s.Renew(ctx(t), p)
				}()
			}
			close(start)
			wg.Wait()
			won := 0
			for i, err := range errs {
				switch {
				case err == nil:
					won++
				case errors.Is(err, store.ErrRefused):
				default:
					t.Errorf("renewal %d: %v", i, err)
				}
			}
			if most := map[time.Duration]int{0: 1, grace: 2}[g]; won < 1 || won > most {
				t.Fatalf("%d of %d concurrent renewals of one secret succeeded, want 1 to %d", won, n, most)
			}
			// The losers were reuse: every secret given out is revoked.
			for i := range n {
				_, err := s.Renew(ctx(t), renewParams(fmt.Sprint("next", i), "x", t0.Add(2*time.Minute)))
				if !errors.Is(err, store.ErrRefused) {
					t.Errorf("next%d after reuse: %v, want refused", i, err)
				}
			}
		})
	}
}
