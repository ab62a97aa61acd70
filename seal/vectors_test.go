package seal_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flamenet/relay/seal"
)

var update = flag.Bool("update", false, "rewrite seal/testdata/e2e/vectors.json")

// vectorsPath is where both clients read the test vectors.
var vectorsPath = filepath.Join("testdata", "e2e", "vectors.json")

// The schema of vectors.json (docs/E2E.md, Test vectors).
type vectorFile struct {
	Format        int            `json:"format"`
	Devices       []vectorDevice `json:"devices"`
	SafetyNumbers []safetyNumber `json:"safety_numbers"`
	Valid         []vector       `json:"valid"`
	Invalid       []vector       `json:"invalid"`
}

type vectorDevice struct {
	Household    string `json:"household"`
	Device       string `json:"device"`
	Seed         string `json:"seed"`
	Public       string `json:"public"`
	X25519Public string `json:"x25519_public"`
	Fingerprint  string `json:"fingerprint"`
}

type safetyNumber struct {
	A      string `json:"a"`
	B      string `json:"b"`
	Number string `json:"number"`
}

type vector struct {
	Name      string  `json:"name"`
	Household string  `json:"household"`
	ID        string  `json:"id"`
	From      string  `json:"from"`
	Opener    string  `json:"opener"`
	Sealed    string  `json:"sealed"`
	Plaintext *string `json:"plaintext,omitempty"` // valid vectors only, "" included
	Error     string  `json:"error,omitempty"`
}

// longName is a device name of the longest length the protocol allows.
var longName = strings.Repeat("w", 40) + ".0123456789_ABCDEFGHIJ-"

// seeds of the vector devices: phone's is libsodium's ed25519_convert
// test seed and laptop's RFC 8032's TEST 1, so their X25519 forms are
// known answers (TestKnownX25519).
var seeds = map[string]string{
	"phone":  "421151a459faeade3d247115f94aedae42318124095afabe4d1451a559faedee",
	"laptop": "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
	"tablet": seedOf("tablet"),
	longName: seedOf("watch"),
	// Not in the vector file's devices: nobody has pinned them.
	"stranger":   seedOf("stranger"),
	"laptop-new": seedOf("laptop-new"),
	"phone-old":  seedOf("phone-old"),
}

func seedOf(name string) string {
	h := sha256.Sum256([]byte("fn-seal test vector seed " + name))
	return hex.EncodeToString(h[:])
}

func identity(tb testing.TB, name string) *seal.Identity {
	tb.Helper()
	seed, err := hex.DecodeString(seeds[name])
	if err != nil {
		tb.Fatal(err)
	}
	id, err := seal.IdentityFromSeed(seed)
	if err != nil {
		tb.Fatal(err)
	}
	return id
}

// sealFor seals plaintext from sender (whose identity is signer's) to the
// named devices, each with the key of the identity named in keys (or its
// own).
func sealFor(tb testing.TB, household, id, sender, signer string, to []string, keys map[string]string, plaintext []byte) []byte {
	tb.Helper()
	var rs []seal.Recipient
	for _, d := range to {
		k := d
		if keys[d] != "" {
			k = keys[d]
		}
		rs = append(rs, seal.Recipient{Device: d, Key: identity(tb, k).Public()})
	}
	b, err := seal.Seal(seal.SealParams{Household: household, ID: id, Sender: sender, Identity: identity(tb, signer), Recipients: rs, Plaintext: plaintext})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// field is one part of an envelope's layout: where it starts and its size.
type field struct {
	name     string
	off, len int
}

// layoutOf walks an envelope's layout on its own, apart from the package's
// parser, as a reader of docs/E2E.md would.
func layoutOf(tb testing.TB, b []byte) []field {
	tb.Helper()
	var fs []field
	off := 0
	add := func(name string, n int) int {
		fs = append(fs, field{name, off, n})
		off += n
		return off - n
	}
	str8 := func(name string) {
		add(name+" length", 1)
		add(name, int(b[off-1]))
	}
	add("magic", 3)
	add("version", 1)
	str8("household")
	str8("id")
	str8("sender")
	add("sender_key", 32)
	count := int(b[add("count", 1)])
	for i := range count {
		str8(fmt.Sprintf("slot %d recipient", i))
		add(fmt.Sprintf("slot %d key_id", i), 8)
		add(fmt.Sprintf("slot %d enc", i), 32)
		add(fmt.Sprintf("slot %d wrapped", i), 48)
	}
	add("nonce", 12)
	n := int(b[off])<<24 | int(b[off+1])<<16 | int(b[off+2])<<8 | int(b[off+3])
	add("length", 4)
	add("ciphertext", n)
	add("signature", 64)
	if off != len(b) {
		tb.Fatalf("layout: %d bytes, the envelope has %d", off, len(b))
	}
	return fs
}

func fieldOf(tb testing.TB, b []byte, name string) field {
	tb.Helper()
	for _, f := range layoutOf(tb, b) {
		if f.name == name {
			return f
		}
	}
	tb.Fatalf("no field %q", name)
	return field{}
}

// flipped is b with bit 0 of byte at flipped; for a length it flips the
// last byte (the low bit of the big-endian number).
func flipped(b []byte, at int) []byte {
	c := bytes.Clone(b)
	c[at] ^= 0x01
	return c
}

// resign replaces the signature with signer's over the changed bytes: a
// sender that seals something broken, rather than a relay that tampers.
func resign(tb testing.TB, b []byte, signer string) []byte {
	tb.Helper()
	body := b[:len(b)-64]
	key := ed25519.NewKeyFromSeed(identity(tb, signer).Seed())
	sig := ed25519.Sign(key, append([]byte("fn-seal v1 sig\x00"), body...))
	return append(bytes.Clone(body), sig...)
}

// buildVectors seals every case afresh; the error each invalid case must
// give is written here by hand, from the order of the checks in the
// format, not taken from Open.
func buildVectors(tb testing.TB) vectorFile {
	tb.Helper()
	v := vectorFile{Format: 1}
	devices := []string{"phone", "laptop", "tablet", longName}
	for _, d := range devices {
		id := identity(tb, d)
		v.Devices = append(v.Devices, vectorDevice{
			Household: "home", Device: d, Seed: seeds[d],
			Public:       hex.EncodeToString(id.Public()),
			X25519Public: hex.EncodeToString(id.X25519Public()),
			Fingerprint:  id.Fingerprint(),
		})
	}
	for _, p := range [][2]string{{"phone", "laptop"}, {"phone", "tablet"}, {"laptop", "tablet"}, {"tablet", longName}} {
		v.SafetyNumbers = append(v.SafetyNumbers, safetyNumber{A: p[0], B: p[1], Number: seal.SafetyNumber(identity(tb, p[0]).Public(), identity(tb, p[1]).Public())})
	}
	valid := func(name, id, from, opener string, sealed, plaintext []byte) {
		pt := hex.EncodeToString(plaintext)
		v.Valid = append(v.Valid, vector{Name: name, Household: "home", ID: id, From: from, Opener: opener, Sealed: hex.EncodeToString(sealed), Plaintext: &pt})
	}
	invalid := func(name, household, id, from, opener string, sealed []byte, code string) {
		v.Invalid = append(v.Invalid, vector{Name: name, Household: household, ID: id, From: from, Opener: opener, Sealed: hex.EncodeToString(sealed), Error: code})
	}

	hello := []byte("hello, phone")
	one := sealFor(tb, "home", "msg-1", "laptop", "laptop", []string{"phone"}, nil, hello)
	valid("laptop to phone", "msg-1", "laptop", "phone", one, hello)
	two := sealFor(tb, "home", "msg-2", "laptop", "laptop", []string{"phone", "tablet"}, nil, []byte("to both"))
	valid("laptop to phone and tablet, opened by phone", "msg-2", "laptop", "phone", two, []byte("to both"))
	valid("laptop to phone and tablet, opened by tablet", "msg-2", "laptop", "tablet", two, []byte("to both"))
	valid("empty plaintext", "msg-3", "laptop", "phone", sealFor(tb, "home", "msg-3", "laptop", "laptop", []string{"phone"}, nil, nil), nil)
	big := make([]byte, 5000)
	for i := range big {
		big[i] = byte(i * 7)
	}
	valid("5000-byte plaintext", "msg-4", "laptop", "phone", sealFor(tb, "home", "msg-4", "laptop", "laptop", []string{"phone"}, nil, big), big)
	valid("phone to itself", "note", "phone", "phone", sealFor(tb, "home", "note", "phone", "phone", []string{"phone"}, nil, []byte("note to self")), []byte("note to self"))
	longID := "id with spaces ~!@#$%^&*()_+{}|:\"<>? " + strings.Repeat("x", 128-38) + "."
	longSealed := sealFor(tb, "home", longID, longName, longName, []string{"tablet", longName, "phone"}, nil, []byte("longest names"))
	valid("longest id and device name, three recipients, opened by the last", longID, longName, "phone", longSealed, []byte("longest names"))

	// A bit flipped in each part of a two-recipient envelope: the relay
	// (or the network) changed it after the sender signed.
	codes := map[string]string{
		"magic":                   "malformed",
		"version":                 "version",
		"household length":        "malformed",
		"household":               "wrong_household",
		"id length":               "malformed",
		"id":                      "wrong_id",
		"sender length":           "malformed",
		"sender":                  "wrong_sender",
		"sender_key":              "key_changed",
		"count":                   "malformed",
		"slot 0 recipient length": "malformed",
		"slot 0 recipient":        "signature",
		"slot 0 key_id":           "signature",
		"slot 0 enc":              "signature",
		"slot 0 wrapped":          "signature",
		"slot 1 recipient length": "malformed",
		"slot 1 recipient":        "signature",
		"slot 1 key_id":           "signature",
		"slot 1 enc":              "signature",
		"slot 1 wrapped":          "signature",
		"nonce":                   "signature",
		"length":                  "malformed",
		"ciphertext":              "signature",
		"signature":               "signature",
	}
	for _, f := range layoutOf(tb, two) {
		code, ok := codes[f.name]
		if !ok {
			tb.Fatalf("no expected error for a flip in %s", f.name)
		}
		at := f.off
		if f.name == "length" {
			at = f.off + f.len - 1
		}
		invalid("flipped bit in "+f.name, "home", "msg-2", "laptop", "phone", flipped(two, at), code)
	}
	v2 := bytes.Clone(one)
	v2[3] = 2
	invalid("version 2", "home", "msg-1", "laptop", "phone", v2, "version")
	invalid("trailing byte", "home", "msg-1", "laptop", "phone", append(bytes.Clone(one), 0), "malformed")
	invalid("last byte missing", "home", "msg-1", "laptop", "phone", one[:len(one)-1], "malformed")
	invalid("empty", "home", "msg-1", "laptop", "phone", []byte{}, "malformed")
	invalid("magic only", "home", "msg-1", "laptop", "phone", one[:4], "malformed")

	// What the relay delivered disagrees with what was sealed.
	invalid("replayed under another id", "home", "msg-9", "laptop", "phone", one, "wrong_id")
	invalid("opened in another household", "work", "msg-1", "laptop", "phone", one, "wrong_household")
	invalid("delivered from another device than the sender", "home", "msg-1", "tablet", "phone", one, "wrong_sender")
	invalid("replayed to a device it was not sealed to", "home", "msg-1", "laptop", "tablet", one, "not_addressed")
	invalid("sealed to the phone's old key", "home", "msg-5", "laptop", "phone",
		sealFor(tb, "home", "msg-5", "laptop", "laptop", []string{"phone"}, map[string]string{"phone": "phone-old"}, hello), "not_addressed")
	invalid("unknown sender", "home", "msg-6", "stranger", "phone",
		sealFor(tb, "home", "msg-6", "stranger", "stranger", []string{"phone"}, nil, hello), "unknown_sender")
	invalid("sender's key changed", "home", "msg-7", "laptop", "phone",
		sealFor(tb, "home", "msg-7", "laptop", "laptop-new", []string{"phone"}, nil, hello), "key_changed")

	// Broken by the sender itself, and signed: the signature holds, and the
	// later checks catch it.
	resigned := func(name, at string, code string) {
		f := fieldOf(tb, two, at)
		invalid("signed by the sender with a bit flipped in "+name, "home", "msg-2", "laptop", "phone", resign(tb, flipped(two, f.off), "laptop"), code)
	}
	resigned("the phone's key_id", "slot 0 key_id", "not_addressed")
	resigned("the phone's recipient name", "slot 0 recipient", "not_addressed")
	resigned("the phone's enc", "slot 0 enc", "decrypt")
	resigned("the phone's wrapped key", "slot 0 wrapped", "decrypt")
	resigned("the nonce", "nonce", "decrypt")
	resigned("the ciphertext", "ciphertext", "decrypt")
	// The phone's slot of one envelope moved into another: HPKE's info
	// binds a slot to its envelope's id.
	other := sealFor(tb, "home", "msg-8", "laptop", "laptop", []string{"phone", "tablet"}, nil, []byte("to both"))
	moved := bytes.Clone(two)
	s0, s1 := fieldOf(tb, two, "slot 0 enc"), fieldOf(tb, other, "slot 0 enc")
	copy(moved[s0.off:s0.off+32+48], other[s1.off:s1.off+32+48])
	invalid("signed by the sender with the phone's slot of another envelope", "home", "msg-2", "laptop", "phone", resign(tb, moved, "laptop"), "decrypt")
	// Names the protocol refuses.
	dup := sealFor(tb, "home", "msg-10", "laptop", "laptop", []string{"phone", "phonf"}, map[string]string{"phonf": "tablet"}, hello)
	n := fieldOf(tb, dup, "slot 1 recipient")
	dup[n.off+4] = 'e'
	invalid("a recipient named twice", "home", "msg-10", "laptop", "phone", resign(tb, dup, "laptop"), "malformed")
	bad := bytes.Clone(one)
	bad[fieldOf(tb, one, "household").off+1] = ' '
	invalid("a space in the household's name", "home", "msg-1", "laptop", "phone", resign(tb, bad, "laptop"), "malformed")
	// Well formed but for a count of 0: the only slot cut out.
	count, slot := fieldOf(tb, one, "count"), fieldOf(tb, one, "nonce")
	zero := append(bytes.Clone(one[:count.off]), 0)
	zero = append(zero, one[slot.off:]...)
	invalid("no recipients", "home", "msg-1", "laptop", "phone", resign(tb, zero, "laptop"), "malformed")
	return v
}

// checkVectors opens every vector as the format says: the opener pins
// every device of the file first.
func checkVectors(t *testing.T, v vectorFile) {
	t.Helper()
	if v.Format != 1 {
		t.Fatalf("format %d", v.Format)
	}
	pins := map[string]ed25519.PublicKey{}
	ids := map[string]*seal.Identity{}
	for _, d := range v.Devices {
		seed, _ := hex.DecodeString(d.Seed)
		id, err := seal.IdentityFromSeed(seed)
		if err != nil {
			t.Fatalf("%s: %v", d.Device, err)
		}
		pub, _ := hex.DecodeString(d.Public)
		x, _ := hex.DecodeString(d.X25519Public)
		if !bytes.Equal(id.Public(), pub) || !bytes.Equal(id.X25519Public(), x) || id.Fingerprint() != d.Fingerprint {
			t.Errorf("%s: public %x, X25519 %x, fingerprint %q; the file says %s, %s, %q", d.Device, id.Public(), id.X25519Public(), id.Fingerprint(), d.Public, d.X25519Public, d.Fingerprint)
		}
		if u, err := seal.X25519Key(pub); err != nil || !bytes.Equal(u, x) {
			t.Errorf("%s: X25519 form of the public key %x (%v), want %s", d.Device, u, err, d.X25519Public)
		}
		pins[d.Device], ids[d.Device] = pub, id
	}
	for _, s := range v.SafetyNumbers {
		if got := seal.SafetyNumber(pins[s.A], pins[s.B]); got != s.Number || seal.SafetyNumber(pins[s.B], pins[s.A]) != got {
			t.Errorf("safety number of %s and %s: %q, want %q from both sides", s.A, s.B, got, s.Number)
		}
	}
	open := func(x vector) ([]byte, error) {
		sealed, err := hex.DecodeString(x.Sealed)
		if err != nil {
			t.Fatalf("%s: %v", x.Name, err)
		}
		return seal.Open(seal.OpenParams{Household: x.Household, Device: x.Opener, Identity: ids[x.Opener], ID: x.ID, From: x.From, SenderKey: pins[x.From], Sealed: sealed})
	}
	for _, x := range v.Valid {
		if x.Plaintext == nil {
			t.Fatalf("%s: no plaintext", x.Name)
		}
		got, err := open(x)
		want, _ := hex.DecodeString(*x.Plaintext)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %q, %v; want %q", x.Name, got, err, want)
		}
	}
	for _, x := range v.Invalid {
		got, err := open(x)
		if code := seal.Code(err); code != x.Error || code == "" || got != nil {
			t.Errorf("%s: %q, %v (%q); want error %q", x.Name, got, err, code, x.Error)
		}
	}
}

// TestTampering seals every case afresh and checks that each opens, or
// fails with its own typed error. Each guard of Open was removed once and
// this test (and TestVectors) went red: the parser's magic, version,
// name, count, repeated-recipient and trailing-byte checks; the household,
// id and sender comparisons; the unknown sender and the pin comparison;
// the signature; the slot's recipient name and its key id.
func TestTampering(t *testing.T) {
	checkVectors(t, buildVectors(t))
}

// TestVectors checks the committed vectors, which the TypeScript client
// checks too; -update seals them afresh and writes them.
func TestVectors(t *testing.T) {
	if *update {
		b, err := json.MarshalIndent(buildVectors(t), "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(vectorsPath), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(vectorsPath, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	var v vectorFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	checkVectors(t, v)
	// The file holds every case the code would write: none was dropped
	// or added without -update.
	names := func(v vectorFile) []string {
		var n []string
		for _, x := range append(v.Valid, v.Invalid...) {
			n = append(n, x.Name+" -> "+x.Error)
		}
		return n
	}
	if got, want := names(v), names(buildVectors(t)); !slices.Equal(got, want) {
		t.Errorf("the vectors file's cases differ from the code's; run go test ./seal -run TestVectors -update\nfile: %q\ncode: %q", got, want)
	}
}
