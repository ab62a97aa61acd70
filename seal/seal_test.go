package seal_test

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flamenet/relay/seal"
)

func unhex(tb testing.TB, s string) []byte {
	tb.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestKnownX25519: the derived X25519 keys are libsodium's
// (crypto_sign_ed25519_sk_to_curve25519 and _pk_to_curve25519, its test
// ed25519_convert) and, for RFC 8032's TEST 1 seed, the known answer.
func TestKnownX25519(t *testing.T) {
	tests := []struct {
		name, seed, public, xPublic, xPrivate string
	}{
		{"libsodium ed25519_convert", "421151a459faeade3d247115f94aedae42318124095afabe4d1451a559faedee",
			"b5076a8474a832daee4dd5b4040983b6623b5f344aca57d4d6ee4baf3f259e6e",
			"f1814f0e8ff1043d8a44d25babff3cedcae6c22c3edaa48f857ae70de2baae50",
			"8052030376d47112be7f73ed7a019293dd12ad910b654455798b4667d73de166"},
		{"RFC 8032 TEST 1", "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
			"d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
			"d85e07ec22b0ad881537c2f44d662d1a143cf830c57aca4305d85c7a90f6b62e", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := seal.IdentityFromSeed(unhex(t, tt.seed))
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(id.Public()); got != tt.public {
				t.Errorf("public %s, want %s", got, tt.public)
			}
			if got := hex.EncodeToString(id.X25519Public()); got != tt.xPublic {
				t.Errorf("X25519 public from the seed %s, want %s", got, tt.xPublic)
			}
			u, err := seal.X25519Key(id.Public())
			if err != nil || hex.EncodeToString(u) != tt.xPublic {
				t.Errorf("X25519 public from the Ed25519 key %x (%v), want %s", u, err, tt.xPublic)
			}
			if tt.xPrivate == "" {
				return
			}
			// libsodium prints the clamped scalar; the first half of
			// SHA-512(seed), clamped, is it.
			h := sha512.Sum512(unhex(t, tt.seed))
			h[0] &= 248
			h[31] &= 127
			h[31] |= 64
			if got := hex.EncodeToString(h[:32]); got != tt.xPrivate {
				t.Errorf("clamped private %s, want %s", got, tt.xPrivate)
			}
			priv, _ := ecdh.X25519().NewPrivateKey(h[:32])
			if !bytes.Equal(priv.PublicKey().Bytes(), id.X25519Public()) {
				t.Error("libsodium's private key does not match the identity's X25519 public key")
			}
		})
	}
}

func newIdentity(tb testing.TB) *seal.Identity {
	tb.Helper()
	id, err := seal.NewIdentity()
	if err != nil {
		tb.Fatal(err)
	}
	return id
}

// TestRoundTrip seals to one and to several recipients, empty and large
// payloads; each recipient opens it, and a device not addressed cannot.
func TestRoundTrip(t *testing.T) {
	sender := newIdentity(t)
	devs := map[string]*seal.Identity{"phone": newIdentity(t), "tablet": newIdentity(t), "tv": newIdentity(t), "watch": newIdentity(t)}
	large := make([]byte, 1<<20)
	for i := range large {
		large[i] = byte(i)
	}
	tests := []struct {
		name      string
		to        []string
		plaintext []byte
	}{
		{"one recipient", []string{"phone"}, []byte("hello")},
		{"three recipients", []string{"tv", "phone", "tablet"}, []byte("to all")},
		{"empty", []string{"phone", "tablet"}, nil},
		{"1 MiB", []string{"phone"}, large},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rs []seal.Recipient
			for _, d := range tt.to {
				rs = append(rs, seal.Recipient{Device: d, Key: devs[d].Public()})
			}
			p := seal.SealParams{Household: "home", ID: "id-1", Sender: "laptop", Identity: sender, Recipients: rs, Plaintext: tt.plaintext}
			sealed, err := seal.Seal(p)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := seal.Seal(p)
			if bytes.Equal(sealed, again) {
				t.Error("two seals of the same plaintext are the same bytes")
			}
			for d, id := range devs {
				got, err := seal.Open(seal.OpenParams{Household: "home", Device: d, Identity: id, ID: "id-1", From: "laptop", SenderKey: sender.Public(), Sealed: sealed})
				addressed := strings.Contains(strings.Join(tt.to, ","), d)
				switch {
				case addressed && (err != nil || !bytes.Equal(got, tt.plaintext) || got == nil):
					t.Errorf("%s: %v, plaintext equal: %v", d, err, bytes.Equal(got, tt.plaintext))
				case !addressed && !errors.Is(err, seal.ErrNotAddressed):
					t.Errorf("%s, not addressed: %v", d, err)
				}
			}
		})
	}
}

// TestSealRefuses: names and ids the protocol refuses, no or too many
// recipients, a recipient named twice and keys that are not keys.
func TestSealRefuses(t *testing.T) {
	sender := newIdentity(t)
	ok := seal.Recipient{Device: "phone", Key: newIdentity(t).Public()}
	many := make([]seal.Recipient, 256)
	for i := range many {
		many[i] = seal.Recipient{Device: fmt.Sprint("d", i), Key: ok.Key}
	}
	small := make([]byte, 32) // the identity point's neighbour: small order
	small[0] = 1
	tests := []struct {
		name string
		p    seal.SealParams
	}{
		{"bad household", seal.SealParams{Household: "ho me", ID: "x", Sender: "laptop", Recipients: []seal.Recipient{ok}}},
		{"empty id", seal.SealParams{Household: "home", ID: "", Sender: "laptop", Recipients: []seal.Recipient{ok}}},
		{"id of 129", seal.SealParams{Household: "home", ID: strings.Repeat("i", 129), Sender: "laptop", Recipients: []seal.Recipient{ok}}},
		{"id with a newline", seal.SealParams{Household: "home", ID: "a\nb", Sender: "laptop", Recipients: []seal.Recipient{ok}}},
		{"bad sender", seal.SealParams{Household: "home", ID: "x", Sender: strings.Repeat("s", 65), Recipients: []seal.Recipient{ok}}},
		{"no recipient", seal.SealParams{Household: "home", ID: "x", Sender: "laptop"}},
		{"256 recipients", seal.SealParams{Household: "home", ID: "x", Sender: "laptop", Recipients: many}},
		{"a recipient twice", seal.SealParams{Household: "home", ID: "x", Sender: "laptop", Recipients: []seal.Recipient{ok, ok}}},
		{"a bad recipient name", seal.SealParams{Household: "home", ID: "x", Sender: "laptop", Recipients: []seal.Recipient{{Device: "a/b", Key: ok.Key}}}},
		{"a key of small order", seal.SealParams{Household: "home", ID: "x", Sender: "laptop", Recipients: []seal.Recipient{{Device: "phone", Key: small}}}},
		{"a short key", seal.SealParams{Household: "home", ID: "x", Sender: "laptop", Recipients: []seal.Recipient{{Device: "phone", Key: ok.Key[:31]}}}},
	}
	for _, tt := range tests {
		tt.p.Identity = sender
		if b, err := seal.Seal(tt.p); err == nil {
			t.Errorf("%s: sealed %d bytes", tt.name, len(b))
		}
	}
	many = many[:255]
	if _, err := seal.Seal(seal.SealParams{Household: "home", ID: strings.Repeat("i", 128), Sender: strings.Repeat("s", 64), Identity: sender, Recipients: many}); err != nil {
		t.Errorf("255 recipients, longest id and name: %v", err)
	}
}

// TestFingerprint computes the format's fingerprint with big integers,
// apart from the package's code, and checks the safety number's symmetry.
func TestFingerprint(t *testing.T) {
	a, b := newIdentity(t).Public(), newIdentity(t).Public()
	sum := sha256.Sum256(append([]byte("fn-seal v1 fingerprint\x00"), a...))
	var groups []string
	for i := range 6 {
		n := new(big.Int).SetBytes(sum[5*i : 5*i+5])
		groups = append(groups, fmt.Sprintf("%05d", new(big.Int).Mod(n, big.NewInt(100000))))
	}
	if got, want := seal.Fingerprint(a), strings.Join(groups, " "); got != want {
		t.Errorf("fingerprint %q, want %q", got, want)
	}
	ab, ba := seal.SafetyNumber(a, b), seal.SafetyNumber(b, a)
	fa, fb := seal.Fingerprint(a), seal.Fingerprint(b)
	if ab != ba || len(ab) != 71 || !strings.Contains(ab, fa) || !strings.Contains(ab, fb) || ab[:35] > ab[36:] {
		t.Errorf("safety number %q / %q of %q and %q", ab, ba, fa, fb)
	}
}

// TestIdentityFile: created 0600 once, read back the same after, never
// overwritten; a file that is not a seed is an error.
func TestIdentityFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "phone.seed")
	id, created, err := seal.LoadOrCreateIdentity(path)
	if err != nil || !created {
		t.Fatalf("created %v, %v", created, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v", fi.Mode(), err)
	}
	again, created, err := seal.LoadOrCreateIdentity(path)
	if err != nil || created || !bytes.Equal(again.Public(), id.Public()) {
		t.Fatalf("read back: created %v, %v, same key: %v", created, err, bytes.Equal(again.Public(), id.Public()))
	}
	if err := seal.SaveIdentity(path, newIdentity(t)); err == nil {
		t.Error("SaveIdentity replaced an identity file")
	}
	if again, _ := seal.LoadIdentity(path); !bytes.Equal(again.Public(), id.Public()) {
		t.Error("the identity file changed")
	}
	bad := filepath.Join(t.TempDir(), "bad")
	os.WriteFile(bad, []byte("not hex\n"), 0o600)
	if _, _, err := seal.LoadOrCreateIdentity(bad); err == nil {
		t.Error("a file that is not a seed was read")
	}
}

// TestIdentityPrints: formatting an identity, as a log line might, shows
// its fingerprint and never its seed or private keys. Seen red without
// String and GoString.
func TestIdentityPrints(t *testing.T) {
	id := newIdentity(t)
	seed := id.Seed()
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%q"} {
		out := fmt.Sprintf(verb, id)
		if strings.Contains(out, hex.EncodeToString(seed)) || strings.Contains(out, string(seed)) || strings.Contains(out, fmt.Sprint(seed)) || strings.Contains(out, fmt.Sprint(seed[:4])[1:8]) {
			t.Errorf("%s shows the seed: %s", verb, out)
		}
	}
	if out := fmt.Sprint(id); !strings.Contains(out, id.Fingerprint()) {
		t.Errorf("%%v is %q, not the fingerprint", out)
	}
}

type failingStore struct{ seal.MemoryStore }

func (*failingStore) Save(context.Context, map[string]ed25519.PublicKey) error {
	return errors.New("disk full")
}

// TestKeyring: a directory read pins unseen keys (saved to a 0600 file);
// a changed key is reported, by Observe and the callback, the pin kept and
// nothing sealed to it; Trust takes the new key. Unpinned and keyless
// devices are not sealed to. Broken once each and seen red: keeping the
// pin on a change (Observe), the refusals in Recipients (no pin, no key
// listed, changed key), the invalid-key check in Observe, and pinning only
// once saved.
func TestKeyring(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "phone.pins")
	var reported []seal.KeyChange
	ring, err := seal.OpenKeyring(ctx, seal.FileStore(path), seal.OnKeyChange(func(c seal.KeyChange) { reported = append(reported, c) }))
	if err != nil {
		t.Fatal(err)
	}
	laptop, tablet := newIdentity(t), newIdentity(t)
	if _, err := ring.Recipients([]string{"laptop"}); !errors.Is(err, seal.ErrUnknownSender) {
		t.Errorf("sealing to an unpinned device: %v", err)
	}
	changes, err := ring.Observe(ctx, []seal.Listing{{Device: "laptop", Key: laptop.Public()}, {Device: "tablet", Key: tablet.Public()}, {Device: "tv"}, {Device: "bad", Key: make([]byte, 32)}})
	if err != nil || len(changes) != 0 {
		t.Fatalf("first read: %v, %v", changes, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("keyring file: %v, %v", fi, err)
	}
	if _, ok := ring.Pinned("bad"); ok {
		t.Error("pinned a key that is not a valid Ed25519 public key")
	}
	rs, err := ring.Recipients([]string{"laptop", "tablet"})
	if err != nil || len(rs) != 2 || !bytes.Equal(rs[0].Key, laptop.Public()) || !bytes.Equal(rs[1].Key, tablet.Public()) {
		t.Fatalf("recipients %v, %v", rs, err)
	}
	for _, d := range []string{"tv", "bad", "nobody"} {
		if _, err := ring.Recipients([]string{"laptop", d}); !errors.Is(err, seal.ErrUnknownSender) {
			t.Errorf("sealing to %s: %v", d, err)
		}
	}

	// The tablet registers again without a key: nothing is sealed to it,
	// though its old key stays pinned.
	if _, err := ring.Observe(ctx, []seal.Listing{{Device: "tablet"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ring.Recipients([]string{"tablet"}); !errors.Is(err, seal.ErrUnknownSender) {
		t.Errorf("sealing to a device listed without a key: %v", err)
	}

	// The laptop's key changes in the directory.
	newLaptop := newIdentity(t)
	changes, err = ring.Observe(ctx, []seal.Listing{{Device: "laptop", Key: newLaptop.Public()}, {Device: "tablet", Key: tablet.Public()}})
	want := seal.KeyChange{Device: "laptop", Pinned: laptop.Public(), Listed: newLaptop.Public()}
	if err != nil || len(changes) != 1 || fmt.Sprint(changes[0]) != fmt.Sprint(want) || len(reported) != 1 || fmt.Sprint(reported[0]) != fmt.Sprint(want) {
		t.Fatalf("changes %v, reported %v, %v; want %v", changes, reported, err, want)
	}
	if pin, _ := ring.Pinned("laptop"); !bytes.Equal(pin, laptop.Public()) {
		t.Error("the pin moved to the changed key")
	}
	if _, err := ring.Recipients([]string{"tablet", "laptop"}); !errors.Is(err, seal.ErrKeyChanged) {
		t.Errorf("sealing to a changed key: %v", err)
	}
	sealed, err := seal.Seal(seal.SealParams{Household: "home", ID: "x", Sender: "laptop", Identity: newLaptop, Recipients: []seal.Recipient{{Device: "phone", Key: tablet.Public()}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ring.Open(seal.OpenParams{Household: "home", Device: "phone", Identity: tablet, ID: "x", From: "laptop", Sealed: sealed}); !errors.Is(err, seal.ErrKeyChanged) {
		t.Errorf("opening from the changed key: %v", err)
	}
	// A keyring read from the file has the old pin.
	again, err := seal.OpenKeyring(ctx, seal.FileStore(path))
	if err != nil {
		t.Fatal(err)
	}
	if pin, _ := again.Pinned("laptop"); !bytes.Equal(pin, laptop.Public()) {
		t.Error("the saved pin moved to the changed key")
	}

	// The app checked the new key and trusts it.
	if err := ring.Trust(ctx, "laptop", newLaptop.Public()); err != nil {
		t.Fatal(err)
	}
	if _, err := ring.Recipients([]string{"laptop"}); err != nil {
		t.Errorf("after Trust: %v", err)
	}
	if pt, err := ring.Open(seal.OpenParams{Household: "home", Device: "phone", Identity: tablet, ID: "x", From: "laptop", Sealed: sealed}); err != nil || pt == nil {
		t.Errorf("opening after Trust: %v", err)
	}
	again, _ = seal.OpenKeyring(ctx, seal.FileStore(path))
	if pin, _ := again.Pinned("laptop"); !bytes.Equal(pin, newLaptop.Public()) {
		t.Error("Trust was not saved")
	}
	if err := ring.Trust(ctx, "laptop", make([]byte, 32)); err == nil {
		t.Error("Trust took a key of small order")
	}

	// A pin that could not be saved is not taken.
	failing, _ := seal.OpenKeyring(ctx, &failingStore{})
	if _, err := failing.Observe(ctx, []seal.Listing{{Device: "laptop", Key: laptop.Public()}}); err == nil {
		t.Error("Observe did not report the failed save")
	}
	if _, ok := failing.Pinned("laptop"); ok {
		t.Error("a pin that was not saved was taken")
	}
}

// TestFileStore: no temporary file left behind; a file that does not hold
// pins is an error, not an empty keyring.
func TestFileStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "pins.json")
	key := newIdentity(t).Public()
	if err := seal.FileStore(path).Save(ctx, map[string]ed25519.PublicKey{"laptop": key}); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("files after Save: %v", entries)
	}
	pins, err := seal.FileStore(path).Load(ctx)
	if err != nil || !bytes.Equal(pins["laptop"], key) || len(pins) != 1 {
		t.Errorf("loaded %v, %v", pins, err)
	}
	for _, bad := range []string{"{", `{"pins":{"laptop":"AAAA"}}`} {
		os.WriteFile(path, []byte(bad), 0o600)
		if _, err := seal.FileStore(path).Load(ctx); err == nil {
			t.Errorf("%q loaded", bad)
		}
	}
}
