// Package storetest is the conformance suite every store backend must pass.
// It tests only what store.Store and docs/PROTOCOL.md promise, never a
// backend's insides, so that a behaviour exists in every backend or in none.
//
// Where the contract leaves a choice, the suite fixes it:
//
//   - A device deleted and then registered again starts afresh: cursor and
//     head restart at 0 and its first envelope is seq 1 again. Its older
//     tokens stay refused through RemovedAt, which keeps the last removal.
//   - An ack of a device that does not exist registers it, whatever the
//     cursor, even a negative one that only asks for the position.
//   - Pending limits are inclusive: a recipient may hold exactly
//     MaxPendingEnvelopes envelopes and MaxPendingBytes bytes, and a
//     household exactly MaxHouseholdPendingBytes bytes. Unknown recipients
//     are reported first, then a full queue, then a full household.
//   - AckMany skips devices that do not exist (it never registers one),
//     and clamps a cursor past the head to the head.
//   - One Expire call deletes everything that is due, in as many batches of
//     at most Batch rows as that takes.
//   - A send that failed stored nothing, its id included: the same id may be
//     sent again and is not a conflict.
//
// A backend's test calls Run with a function that opens a fresh, empty store.
// Run closes every store it opens; open should clean up whatever else it
// made (a schema, a file) with t.Cleanup.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
)

// Opener opens a fresh, empty store for one test.
type Opener func(t *testing.T) store.Store

// t0 is the suite's clock: whole microseconds, so that every backend can
// store it exactly.
var t0 = time.Date(2026, 11, 29, 18, 2, 3, 123456000, time.UTC)

const hh = "home"

// Run runs the whole suite, each subtest on a fresh store from open.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, open Opener)
	}{
		{"Register", testRegister},
		{"Send", testSend},
		{"Ack", testAck},
		{"AckMany", testAckMany},
		{"State", testState},
		{"Fetch", testFetch},
		{"FetchRemovedAt", testFetchRemovedAt},
		{"SendRemovedAt", testSendRemovedAt},
		{"HouseholdFull", testHouseholdFull},
		{"RepeatWakes", testRepeatWakes},
		{"Devices", testDevices},
		{"Delete", testDelete},
		{"StaleCredential", testStaleCredential},
		{"Removals", testRemovals},
		{"ClearPush", testClearPush},
		{"Expire", testExpire},
		{"Concurrency", testConcurrency},
		{"ReportHealth", testReportHealth},
		{"Pair", testPair},
		{"Invitations", testInvitations},
		{"Renew", testRenew},
		{"PairingRemoval", testPairingRemoval},
		{"ConcurrentRenewals", testConcurrentRenewals},
		{"Thief", testThief},
		{"InviteExisting", testInviteExisting},
		{"CancelInvitation", testCancelInvitation},
		{"AdminRemoval", testAdminRemoval},
		{"PingClose", testPingClose},
		{"Epoch", testEpoch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, open) })
	}
}

// fresh opens a store and closes it when the test ends.
func fresh(t *testing.T, open Opener) store.Store {
	t.Helper()
	s := open(t)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// ctx bounds a call so that a hung store fails the test instead of
// stalling the run.
func ctx(tb testing.TB) context.Context {
	tb.Helper()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return c
}

func register(t testing.TB, s store.Store, household string, devices ...string) {
	t.Helper()
	for _, d := range devices {
		if _, err := s.Register(context.Background(), store.RegisterParams{Household: household, Device: d, Now: t0}); err != nil {
			t.Fatalf("Register(%s/%s): %v", household, d, err)
		}
	}
}

// sendOK sends and fails the test on error.
func sendOK(t testing.TB, s store.Store, p store.SendParams) store.SendResult {
	t.Helper()
	if p.Household == "" {
		p.Household = hh
	}
	if p.Now.IsZero() {
		p.Now = t0
	}
	res, err := s.Send(context.Background(), p)
	if err != nil {
		t.Fatalf("Send(%s from %s to %v): %v", p.ID, p.Sender, p.To, err)
	}
	return res
}

// sendErr sends and returns the error, with the suite's defaults.
func sendErr(s store.Store, p store.SendParams) error {
	if p.Household == "" {
		p.Household = hh
	}
	if p.Now.IsZero() {
		p.Now = t0
	}
	_, err := s.Send(context.Background(), p)
	return err
}

// position reads where an existing device stands without moving it.
func position(t testing.TB, s store.Store, household, device string) store.Position {
	t.Helper()
	p, err := s.Ack(context.Background(), store.AckParams{Household: household, Device: device, Cursor: -1, Now: t0})
	if err != nil {
		t.Fatalf("Ack(%s/%s, -1): %v", household, device, err)
	}
	return withoutEpoch(t, p)
}

// withoutEpoch checks that a position names the store's epoch, and returns
// it without, for the tests that compare positions whole.
func withoutEpoch(t testing.TB, p store.Position) store.Position {
	t.Helper()
	if !store.ValidEpoch(p.Epoch) || len(p.Epoch) != 16 {
		t.Fatalf("position %+v does not name an epoch of 16 characters", p)
	}
	p.Epoch = ""
	return p
}

func ack(t testing.TB, s store.Store, household, device string, cursor int64) store.Position {
	t.Helper()
	p, err := s.Ack(context.Background(), store.AckParams{Household: household, Device: device, Cursor: cursor, Now: t0})
	if err != nil {
		t.Fatalf("Ack(%s/%s, %d): %v", household, device, cursor, err)
	}
	return withoutEpoch(t, p)
}

// fetchAll reads every envelope above after, a page at a time.
func fetchAll(t testing.TB, s store.Store, household, device string, after int64) []store.Envelope {
	t.Helper()
	var all []store.Envelope
	for range 10000 {
		b, err := s.Fetch(context.Background(), store.FetchParams{
			Household: household, Device: device, After: after, Limit: 100, Budget: 1 << 30,
		})
		if err != nil {
			t.Fatalf("Fetch(%s/%s after %d): %v", household, device, after, err)
		}
		all = append(all, b.Envelopes...)
		if len(b.Envelopes) > 0 {
			after = b.Envelopes[len(b.Envelopes)-1].Seq
		}
		if !b.More {
			return all
		}
		if len(b.Envelopes) == 0 {
			t.Fatalf("Fetch(%s/%s): More with no envelopes", household, device)
		}
	}
	t.Fatalf("Fetch(%s/%s): More never ended", household, device)
	return nil
}

func seqs(es []store.Envelope) []int64 {
	out := make([]int64, len(es))
	for i, e := range es {
		out[i] = e.Seq
	}
	return out
}

func deliveries(ds []store.Delivery) string {
	var b bytes.Buffer
	for i, d := range ds {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s:%d", d.Device, d.Seq)
	}
	return b.String()
}

func testPingClose(t *testing.T, open Opener) {
	t.Run("Ping", func(t *testing.T) {
		s := fresh(t, open)
		if err := s.Ping(ctx(t)); err != nil {
			t.Fatalf("Ping: %v", err)
		}
	})
	t.Run("Close", func(t *testing.T) {
		s := open(t) // closed here, not by fresh
		register(t, s, hh, "a")
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		// A closed store must refuse writes rather than pretend to store.
		err := sendErr(s, store.SendParams{Sender: "a", ID: "after-close", To: []string{"a"}, Payload: []byte("x")})
		if err == nil {
			t.Fatal("Send after Close succeeded")
		}
	})
}

func isUnknown(err error, device string) error {
	if !errors.Is(err, store.ErrUnknownDevice) {
		return fmt.Errorf("got %v, want ErrUnknownDevice", err)
	}
	var ue *store.UnknownDeviceError
	if !errors.As(err, &ue) {
		return fmt.Errorf("got %T %v, want a *store.UnknownDeviceError", err, err)
	}
	if ue.Device != device {
		return fmt.Errorf("UnknownDeviceError names %q, want %q", ue.Device, device)
	}
	return nil
}

func isQueueFull(err error, device string) error {
	if !errors.Is(err, store.ErrQueueFull) {
		return fmt.Errorf("got %v, want ErrQueueFull", err)
	}
	var qe *store.QueueFullError
	if !errors.As(err, &qe) {
		return fmt.Errorf("got %T %v, want a *store.QueueFullError", err, err)
	}
	if qe.Device != device {
		return fmt.Errorf("QueueFullError names %q, want %q", qe.Device, device)
	}
	return nil
}
