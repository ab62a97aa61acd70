package client_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/seal"
)

// sealedDevice is one device of a test household: its client, identity,
// keyring and Sealer, and the key changes its keyring reported.
type sealedDevice struct {
	c    *client.Client
	id   *seal.Identity
	ring *seal.Keyring
	s    *client.Sealer

	mu      sync.Mutex
	changes []seal.KeyChange
}

func (d *sealedDevice) reported() []seal.KeyChange {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.changes)
}

// newSealedDevice registers name in household with a fresh identity.
func newSealedDevice(t *testing.T, r *testRelay, household, name string) *sealedDevice {
	t.Helper()
	ctx := context.Background()
	id, err := seal.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	d := &sealedDevice{id: id, c: newClient(t, r.URL, r.token(household, name), client.WithWait(5))}
	d.ring, err = seal.OpenKeyring(ctx, &seal.MemoryStore{}, seal.OnKeyChange(func(kc seal.KeyChange) {
		d.mu.Lock()
		d.changes = append(d.changes, kc)
		d.mu.Unlock()
	}))
	if err != nil {
		t.Fatal(err)
	}
	if d.s, err = d.c.NewSealer(ctx, id, d.ring); err != nil {
		t.Fatal(err)
	}
	if d.s.Household() != household || d.s.Device() != name {
		t.Fatalf("sealer of %s/%s names %s/%s", household, name, d.s.Household(), d.s.Device())
	}
	return d
}

// TestSealedRoundTrip: one sealed send to two devices through a real
// relay; each opens it, pinning the sender from the directory, and the
// relay held only sealed bytes.
func TestSealedRoundTrip(t *testing.T) {
	r := newRelay(t, nil)
	ctx := context.Background()
	laptop := newSealedDevice(t, r, "home", "laptop")
	phone := newSealedDevice(t, r, "home", "phone")
	tablet := newSealedDevice(t, r, "home", "tablet")
	plaintext := []byte("the door code is 4711")
	res, err := laptop.s.SendSealed(ctx, "m1", []string{"phone", "tablet", "phone"}, plaintext)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Deliveries) != 2 {
		t.Fatalf("deliveries %v", res.Deliveries)
	}
	for _, d := range []*sealedDevice{phone, tablet} {
		es := pollAll(t, d.c)
		if len(es) != 1 || bytes.Contains(es[0].Payload, plaintext) || !bytes.HasPrefix(es[0].Payload, []byte("FNE\x01")) {
			t.Fatalf("%s got %d envelopes: %+v", d.s.Device(), len(es), es)
		}
		got, err := d.s.OpenEnvelope(ctx, es[0])
		if err != nil || !bytes.Equal(got, plaintext) {
			t.Errorf("%s opened %q, %v", d.s.Device(), got, err)
		}
		if pin, ok := d.ring.Pinned("laptop"); !ok || !bytes.Equal(pin, laptop.id.Public()) {
			t.Errorf("%s did not pin the laptop's key", d.s.Device())
		}
	}
}

// TestSealedKeyChange: a device whose directory key changed is reported
// to the app and not sealed to until the app trusts the new key; an
// envelope sealed with a changed key does not open, and the change is
// reported on the opening side too.
func TestSealedKeyChange(t *testing.T) {
	r := newRelay(t, nil)
	ctx := context.Background()
	laptop := newSealedDevice(t, r, "home", "laptop")
	phone := newSealedDevice(t, r, "home", "phone")
	if _, err := laptop.s.SendSealed(ctx, "m1", []string{"phone"}, []byte("first")); err != nil {
		t.Fatal(err)
	}
	if got, err := phone.s.OpenEnvelope(ctx, pollAll(t, phone.c)[0]); err != nil || string(got) != "first" {
		t.Fatalf("first: %q, %v", got, err)
	}

	// Someone with the phone's token (or the relay) puts another key in
	// the directory.
	newPhone := newSealedDevice(t, r, "home", "phone")
	_, err := laptop.s.SendSealed(ctx, "m2", []string{"phone"}, []byte("second"))
	if !errors.Is(err, seal.ErrKeyChanged) {
		t.Fatalf("sealing to the changed key: %v", err)
	}
	if kc := laptop.reported(); len(kc) != 1 || kc[0].Device != "phone" || !bytes.Equal(kc[0].Pinned, phone.id.Public()) || !bytes.Equal(kc[0].Listed, newPhone.id.Public()) {
		t.Fatalf("reported %v", kc)
	}
	if es := pollAll(t, newPhone.c); len(es) != 1 {
		t.Fatalf("the refused send reached the relay: %d envelopes", len(es))
	}

	// The laptop's user compared fingerprints and trusts the new key.
	key, err := laptop.s.TrustListed(ctx, "phone")
	if err != nil || !bytes.Equal(key, newPhone.id.Public()) {
		t.Fatalf("TrustListed: %v", err)
	}
	if _, err := laptop.s.SendSealed(ctx, "m3", []string{"phone"}, []byte("third")); err != nil {
		t.Fatal(err)
	}
	es := pollAll(t, newPhone.c)
	if got, err := newPhone.s.OpenEnvelope(ctx, es[len(es)-1]); err != nil || string(got) != "third" {
		t.Fatalf("third: %q, %v", got, err)
	}

	// The laptop's key changes: what it seals with the new key is refused
	// by the phone, which pinned the old one, and reported there.
	newLaptop := newSealedDevice(t, r, "home", "laptop")
	if _, err := newLaptop.s.SendSealed(ctx, "m4", []string{"phone"}, []byte("fourth")); err != nil {
		t.Fatal(err)
	}
	es = pollAll(t, newPhone.c)
	if _, err := newPhone.s.OpenEnvelope(ctx, es[len(es)-1]); !errors.Is(err, seal.ErrKeyChanged) {
		t.Fatalf("opening from the changed key: %v", err)
	}
	if kc := newPhone.reported(); len(kc) != 1 || kc[0].Device != "laptop" {
		t.Fatalf("the phone reported %v", kc)
	}
}

// TestSealedKeyChangeHeld: an envelope refused because its sender's key
// changed is kept in the held store while the cursor moves past it; once
// the new key is trusted, the next ListenSealed (a restart: a new Sealer
// on the same files) hands it over opened. DropHeld discards one the user
// will not trust. Seen red when the envelope was acknowledged and gone.
func TestSealedKeyChangeHeld(t *testing.T) {
	r := newRelay(t, nil)
	ctx := context.Background()
	phone := newSealedDevice(t, r, "home", "phone")
	newSealedDevice(t, r, "home", "laptop")
	if _, err := phone.s.Refresh(ctx); err != nil { // pins the first laptop key
		t.Fatal(err)
	}
	newLaptop := newSealedDevice(t, r, "home", "laptop")
	if _, err := newLaptop.s.SendSealed(ctx, "m1", []string{"phone"}, []byte("from the new key")); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cursors, held := client.FileCursor(filepath.Join(dir, "cursor")), client.FileHeld(filepath.Join(dir, "held"))

	// listen hands envelopes to h until it has n lines, then stops.
	listen := func(s *client.Sealer, n int) []string {
		t.Helper()
		var got []string
		ctx, stop := context.WithTimeout(ctx, 20*time.Second)
		defer stop()
		err := s.ListenSealed(ctx, cursors, held, func(_ context.Context, e client.Envelope, pt []byte, openErr error) error {
			got = append(got, e.ID+": "+string(pt)+seal.Code(openErr))
			if len(got) == n {
				stop()
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := listen(phone.s, 1); !slices.Equal(got, []string{"m1: key_changed"}) {
		t.Fatalf("first listen: %q", got)
	}
	if pos, _ := cursors.Load(ctx); pos.Cursor != 1 {
		t.Fatalf("the cursor did not move past the refused envelope: %+v", pos)
	}
	if es, _ := held.Load(ctx); len(es) != 1 || es[0].ID != "m1" {
		t.Fatalf("held %v", es)
	}

	// Restarted: the user compared fingerprints and trusts the new key.
	s, err := phone.c.NewSealer(ctx, phone.id, phone.ring)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TrustListed(ctx, "laptop"); err != nil {
		t.Fatal(err)
	}
	if got := listen(s, 1); !slices.Equal(got, []string{"m1: from the new key"}) {
		t.Fatalf("after trusting: %q", got)
	}
	if es, _ := held.Load(ctx); len(es) != 0 {
		t.Fatalf("still held after opening: %v", es)
	}

	// Another key change, which the user will not trust: dropped.
	newer := newSealedDevice(t, r, "home", "laptop")
	if _, err := newer.s.SendSealed(ctx, "m2", []string{"phone"}, []byte("from a key nobody trusts")); err != nil {
		t.Fatal(err)
	}
	if got := listen(s, 1); !slices.Equal(got, []string{"m2: key_changed"}) {
		t.Fatalf("the second change: %q", got)
	}
	if err := s.ReopenHeld(ctx, held, func(context.Context, client.Envelope, []byte, error) error {
		t.Error("ReopenHeld handed over an envelope whose key is still not trusted")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.DropHeld(ctx, held, "laptop"); n != 1 || err != nil {
		t.Fatalf("DropHeld: %d, %v", n, err)
	}
	if es, _ := held.Load(ctx); len(es) != 0 {
		t.Fatalf("held after DropHeld: %v", es)
	}
}

// TestSealedOwnNewKey: a device that makes a new identity but keeps its
// keyring takes its own new key, not a change: it seals to itself and
// opens what it sealed, and nothing is reported. Seen red without the own
// pin in NewSealer.
func TestSealedOwnNewKey(t *testing.T) {
	r := newRelay(t, nil)
	ctx := context.Background()
	phone := newSealedDevice(t, r, "home", "phone")
	if _, err := phone.s.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	id, _ := seal.NewIdentity()
	s, err := phone.c.NewSealer(ctx, id, phone.ring)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.SendSealed(ctx, "note", []string{"phone"}, []byte("to myself")); err != nil {
		t.Fatal(err)
	}
	if got, err := s.OpenEnvelope(ctx, pollAll(t, phone.c)[0]); err != nil || string(got) != "to myself" {
		t.Errorf("opened %q, %v", got, err)
	}
	if kc := phone.reported(); len(kc) != 0 {
		t.Errorf("reported its own key: %v", kc)
	}
}

// TestSealedUnknown: a device registered without a key, or not at all, is
// not sealed to, and nothing is sent.
func TestSealedUnknown(t *testing.T) {
	r := newRelay(t, nil)
	ctx := context.Background()
	laptop := newSealedDevice(t, r, "home", "laptop")
	tv := newClient(t, r.URL, r.token("home", "tv"))
	if _, err := tv.Register(ctx); err != nil {
		t.Fatal(err)
	}
	for _, to := range [][]string{{"tv"}, {"nobody"}} {
		if _, err := laptop.s.SendSealed(ctx, "m-"+to[0], to, []byte("x")); !errors.Is(err, seal.ErrUnknownSender) {
			t.Errorf("sealing to %v: %v", to, err)
		}
	}
	if es := pollAll(t, tv); len(es) != 0 {
		t.Errorf("the tv got %v", es)
	}
}

// TestSealedTampering: what a relay (or a device of the household) can do
// with a sealed envelope, through a real relay: deliver it to another
// device, under another id, or as another sender's. Each is refused with
// its error, and the listen loop hands the refusal to the app and goes on.
func TestSealedTampering(t *testing.T) {
	r := newRelay(t, nil)
	ctx := context.Background()
	laptop := newSealedDevice(t, r, "home", "laptop")
	phone := newSealedDevice(t, r, "home", "phone")
	tablet := newSealedDevice(t, r, "home", "tablet")
	mallory := newSealedDevice(t, r, "home", "mallory")
	if _, err := laptop.s.SendSealed(ctx, "m1", []string{"phone"}, []byte("for the phone")); err != nil {
		t.Fatal(err)
	}
	sealed := pollAll(t, phone.c)[0].Payload
	// Replays, sent as plain payloads.
	if _, err := laptop.c.Send(ctx, "m1-again", []string{"tablet"}, sealed); err != nil {
		t.Fatal(err)
	}
	if _, err := mallory.c.Send(ctx, "m1", []string{"phone"}, sealed); err != nil {
		t.Fatal(err)
	}
	if _, err := laptop.c.Send(ctx, "m2", []string{"phone"}, sealed); err != nil {
		t.Fatal(err)
	}
	es := pollAll(t, tablet.c)
	if _, err := tablet.s.OpenEnvelope(ctx, es[0]); !errors.Is(err, seal.ErrWrongID) {
		t.Errorf("replayed to the tablet under another id: %v", err)
	}
	es[0].ID = "m1" // as a relay could claim
	if _, err := tablet.s.OpenEnvelope(ctx, es[0]); !errors.Is(err, seal.ErrNotAddressed) {
		t.Errorf("replayed to the tablet: %v", err)
	}

	var got []string
	ctx2, stop := context.WithCancel(ctx)
	defer stop()
	err := phone.s.ListenSealed(ctx2, &client.MemoryCursor{}, &client.MemoryHeld{}, func(ctx context.Context, e client.Envelope, pt []byte, openErr error) error {
		got = append(got, e.ID+" from "+e.From+": "+string(pt)+seal.Code(openErr))
		if len(got) == 3 {
			stop()
		}
		return nil
	})
	want := []string{"m1 from laptop: for the phone", "m1 from mallory: wrong_sender", "m2 from laptop: wrong_id"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("the phone's listen: %v\n got %q\nwant %q", err, got, want)
	}
}

// TestDirectory: the directory is read page by page, in name order, with
// the keys registered; Register's options reach the relay.
func TestDirectory(t *testing.T) {
	r := newRelay(t, nil)
	ctx := context.Background()
	var names []string
	for _, name := range []string{"e", "a", "d", "c", "b"} {
		newSealedDevice(t, r, "home", name)
		names = append(names, name)
	}
	bare := newClient(t, r.URL, r.token("home", "f"))
	if _, err := bare.Register(ctx, client.WithPushTarget("none", "")); err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	names = append(names, "f")
	c := newClient(t, r.URL, r.token("home", "a"))
	page, err := c.Devices(ctx, client.DevicesQuery{Limit: 2})
	if err != nil || len(page.Devices) != 2 || page.Devices[0].Device != "a" || page.Next != "b" {
		t.Fatalf("first page %+v, %v", page, err)
	}
	all, err := c.Directory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range all {
		got = append(got, d.Device)
		if hasKey := d.IdentityKey != nil; hasKey != (d.Device != "f") {
			t.Errorf("%s: identity key %x", d.Device, d.IdentityKey)
		}
		if d.IdentityKey != nil {
			if u, _ := seal.X25519Key(d.IdentityKey); !bytes.Equal(u, d.X25519Key) {
				t.Errorf("%s: the relay's X25519 key %x is not ours %x", d.Device, d.X25519Key, u)
			}
		}
	}
	if !slices.Equal(got, names) {
		t.Errorf("directory %v, want %v", got, names)
	}
	last, err := c.Devices(ctx, client.DevicesQuery{After: "e", Limit: 1})
	if err != nil || len(last.Devices) != 1 || last.Devices[0].Device != "f" || last.Next != "" {
		t.Errorf("last page %+v, %v", last, err)
	}
}

// TestDirectoryGoesForward: a relay whose next page does not move forward
// is an error, not an endless loop. (A stand-in for a relay that lies:
// the real one cannot be made to.)
func TestDirectoryGoesForward(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		after := r.URL.Query().Get("after")
		if after == "" {
			after = "a"
		}
		w.Write([]byte(`{"devices":[{"device":"` + after + `"}],"next":"` + after + `"}`))
	}))
	defer srv.Close()
	c := newClient(t, srv.URL, "token")
	if _, err := c.Directory(context.Background()); err == nil || !strings.Contains(err.Error(), "next") {
		t.Fatalf("a directory that does not go forward: %v", err)
	}
}
