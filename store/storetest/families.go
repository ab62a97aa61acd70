package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
)

// testThief: the owner renews, a thief replays the owner's old secret
// within the grace (taken for the one retry), and both go on: whichever
// goes first, the family ends revoked and both are refused. Pairing the
// device again starts a family the thief's secrets cannot touch.
func testThief(t *testing.T, open Opener) {
	for _, thiefFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("thiefFirst=%v", thiefFirst), func(t *testing.T) {
			s := fresh(t, open)
			invite(t, s, "phone", "C", t0)
			pairOK(t, s, "C", "s0", t0)
			at := t0.Add(time.Hour)
			renewOK(t, s, "s0", "owner1", at)                     // the owner
			renewOK(t, s, "s0", "thief1", at.Add(10*time.Second)) // the thief's copy of s0

			owner := func() {
				_, err := s.Renew(ctx(t), renewParams("owner1", "owner2", at.Add(20*time.Second)))
				refusedFor(t, err, store.RefusedRevoked, "the owner's secret the thief's replay replaced")
			}
			last := "thief1"
			if thiefFirst {
				renewOK(t, s, "thief1", "thief2", at.Add(15*time.Second))
				last = "thief2"
			}
			owner()
			_, err := s.Renew(ctx(t), renewParams(last, "thief3", at.Add(25*time.Second)))
			refusedFor(t, err, store.RefusedRevoked, "the thief's secret after the owner was refused")
			for _, sec := range []string{"s0", "owner1", "thief1", "thief2", "owner2", "thief3"} {
				if _, err := s.Renew(ctx(t), renewParams(sec, "x", at.Add(time.Minute))); !errors.Is(err, store.ErrRefused) {
					t.Errorf("%s after the family was revoked: %v, want refused", sec, err)
				}
			}

			// The owner is invited again, replacing the device: the
			// thief's secrets are gone, and presenting them revokes
			// nothing of the new family.
			inviteWith(t, s, store.InviteParams{Device: "phone", Replace: true}, "AGAIN", at.Add(2*time.Minute))
			pairOK(t, s, "AGAIN", "n0", at.Add(3*time.Minute))
			_, err = s.Renew(ctx(t), renewParams(last, "x", at.Add(4*time.Minute)))
			refusedFor(t, err, store.RefusedUnknown, "the thief's secret after the device was paired again")
			renewOK(t, s, "n0", "n1", at.Add(5*time.Minute))
		})
	}
}

// testInviteExisting: an invitation for a device that exists is refused
// unless it replaces the device; one whose name was taken after it was
// made is refused at redemption; replacing is a removal, then a new life.
func testInviteExisting(t *testing.T, open Opener) {
	s := fresh(t, open)
	oldKey := []byte("old-key-0123456789abcdef01234567")
	invite(t, s, "phone", "C", t0)
	p := pairParams("C", "s0", t0)
	p.IdentityKey = oldKey
	if _, err := s.Pair(ctx(t), p); err != nil {
		t.Fatal(err)
	}
	sendOK(t, s, store.SendParams{Sender: "phone", ID: "a", To: []string{"phone"}, Payload: []byte("x")})

	err := s.CreateInvitation(ctx(t), store.InviteParams{Household: hh, Device: "phone", Scope: "admin",
		Code: store.HashSecret("TAKE"), Now: t0.Add(time.Minute), Expires: t0.Add(time.Hour)})
	if !errors.Is(err, store.ErrDeviceExists) {
		t.Fatalf("an invitation for an existing device: %v, want ErrDeviceExists", err)
	}
	_, err = s.Pair(ctx(t), pairParams("TAKE", "x", t0.Add(2*time.Minute)))
	refusedFor(t, err, store.RefusedUnknown, "the code of a refused invitation")

	// The name is taken between the invitation and its redemption.
	invite(t, s, "laptop", "L", t0)
	register(t, s, hh, "laptop")
	_, err = s.Pair(ctx(t), pairParams("L", "l0", t0.Add(time.Minute)))
	refusedFor(t, err, store.RefusedTaken, "an invitation whose name became a device")
	_, err = s.Renew(ctx(t), renewParams("l0", "x", t0.Add(2*time.Minute)))
	refusedFor(t, err, store.RefusedUnknown, "the secret of a refused pairing")

	// Replacing.
	newKey := []byte("new-key-0123456789abcdef01234567")
	inviteWith(t, s, store.InviteParams{Device: "phone", Replace: true}, "R", t0.Add(time.Minute))
	at := t0.Add(2 * time.Minute)
	p = pairParams("R", "r0", at)
	p.IdentityKey = newKey
	g, err := s.Pair(ctx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	if !g.Replaced || g.RemovedAt.IsZero() || g.RemovedAt.After(at) {
		t.Fatalf("Pair replacing = %+v, want Replaced with a removal at or before %v", g, at)
	}
	if got, err := s.RemovedAt(ctx(t), hh, "phone"); err != nil || !got.Equal(g.RemovedAt) {
		t.Fatalf("RemovedAt = %v, %v, want the grant's %v", got, err, g.RemovedAt)
	}
	_, err = s.Renew(ctx(t), renewParams("s0", "x", at.Add(time.Second)))
	refusedFor(t, err, store.RefusedUnknown, "the replaced device's secret")
	if es := fetchAll(t, s, hh, "phone", 0); len(es) != 0 {
		t.Errorf("the new device holds the replaced one's envelopes %v", seqs(es))
	}
	for _, d := range listAll(t, s, hh) {
		if d.Name == "phone" && string(d.IdentityKey) != string(newKey) {
			t.Errorf("the directory gives phone's key as %q, want the new device's", d.IdentityKey)
		}
	}
	// The old life's credentials are refused by the removal: a register
	// with a token issued before it, and one after, at the new life.
	_, err = s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "phone", Now: at, IssuedAt: g.RemovedAt})
	if !errors.Is(err, store.ErrRemoved) {
		t.Errorf("a register with a credential issued at the replacement: %v, want ErrRemoved", err)
	}
	if _, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "phone", Now: at,
		IssuedAt: g.RemovedAt.Add(time.Microsecond)}); err != nil {
		t.Errorf("a register with a credential issued after the replacement: %v", err)
	}
	if rg := renewOK(t, s, "r0", "r1", at.Add(time.Minute)); !rg.RemovedAt.Equal(g.RemovedAt) {
		t.Errorf("Renew = %+v, want the removal %v with it", rg, g.RemovedAt)
	}

	// A replacing invitation for a name that is free pairs as any other.
	inviteWith(t, s, store.InviteParams{Device: "watch", Replace: true}, "W", t0.Add(time.Minute))
	if g := pairOK(t, s, "W", "w0", at); g.Replaced || !g.RemovedAt.IsZero() {
		t.Errorf("Pair of a free name = %+v, want no replacement", g)
	}
}

// testCancelInvitation: a pending invitation can be cancelled, once; a
// redeemed one cannot.
func testCancelInvitation(t *testing.T, open Opener) {
	s := fresh(t, open)
	invite(t, s, "phone", "P", t0)
	invite(t, s, "laptop", "L", t0)
	if err := s.CancelInvitation(ctx(t), hh, "phone"); err != nil {
		t.Fatal(err)
	}
	_, err := s.Pair(ctx(t), pairParams("P", "x", t0.Add(time.Second)))
	refusedFor(t, err, store.RefusedUnknown, "a cancelled invitation")
	if err := s.CancelInvitation(ctx(t), hh, "phone"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("cancelling again: %v, want ErrNotFound", err)
	}
	if err := s.CancelInvitation(ctx(t), "elsewhere", "laptop"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("cancelling another household's: %v, want ErrNotFound", err)
	}
	pairOK(t, s, "L", "l0", t0.Add(time.Second))
	if err := s.CancelInvitation(ctx(t), hh, "laptop"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("cancelling a redeemed invitation: %v, want ErrNotFound", err)
	}
}

// testAdminRemoval: the unredeemed invitations an admin made die with it;
// another admin's, and the redeemed ones, stay.
func testAdminRemoval(t *testing.T, open Opener) {
	s := fresh(t, open)
	register(t, s, hh, "boss", "other")
	inviteWith(t, s, store.InviteParams{Device: "kid", Scope: "admin", CreatedBy: "boss"}, "K", t0)
	inviteWith(t, s, store.InviteParams{Device: "done", CreatedBy: "boss"}, "D", t0)
	inviteWith(t, s, store.InviteParams{Device: "mine", CreatedBy: "other"}, "M", t0)
	pairOK(t, s, "D", "d0", t0.Add(time.Second))
	if err := s.DeleteDevice(ctx(t), hh, "boss", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	_, err := s.Pair(ctx(t), pairParams("K", "x", t0.Add(2*time.Minute)))
	refusedFor(t, err, store.RefusedUnknown, "a removed admin's invitation")
	ins, err := s.Invitations(ctx(t), store.InvitationsParams{Household: hh, Now: t0.Add(2 * time.Minute), RedeemedSince: t0})
	if err != nil {
		t.Fatal(err)
	}
	got := ""
	for _, in := range ins {
		got += fmt.Sprintf("%s by %s, redeemed %v;", in.Device, in.CreatedBy, !in.RedeemedAt.IsZero())
	}
	if want := "done by boss, redeemed true;mine by other, redeemed false;"; got != want {
		t.Errorf("invitations after the admin's removal: %q, want %q", got, want)
	}
	pairOK(t, s, "M", "m0", t0.Add(2*time.Minute))
}
