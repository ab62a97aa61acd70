package edkey

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"testing"
)

func TestCheck(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	identity := make([]byte, 32)
	identity[0] = 1 // y = 1, x = 0: the neutral element, order 1
	// y = p (2^255 - 19) is y = 0 unreduced: a non-canonical encoding.
	unreduced := []byte{0xed, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}
	// y = 0, x != 0: a point of order 4.
	order4 := make([]byte, 32)
	// identity with the sign bit set: x = 0 and negative, non-canonical.
	negZero := make([]byte, 32)
	negZero[0], negZero[31] = 1, 0x80

	tests := []struct {
		name string
		key  []byte
		want error
	}{
		{"random key", pub, nil},
		{"short", pub[:31], ErrLength},
		{"identity", identity, ErrSmallOrder},
		{"order 4", order4, ErrSmallOrder},
		{"unreduced y", unreduced, ErrNotCanonical},
		{"negative zero x", negZero, ErrNotCanonical},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Check(tt.key)
			if !errors.Is(got, tt.want) {
				t.Fatalf("Check = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestMontgomery(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Montgomery(pub)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 32 {
		t.Fatalf("len = %d, want 32", len(m))
	}
	if _, err := Montgomery(make([]byte, 32)); err == nil {
		t.Fatal("Montgomery of a small-order point succeeded")
	}
}

// TestSharedVectors: the verdict of every identity key the TypeScript
// client is held to as well (seal/testdata/keys).
func TestSharedVectors(t *testing.T) {
	b, err := os.ReadFile("../../seal/testdata/keys/identity_keys.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Keys []struct{ Key, Verdict, Note string }
	}
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	want := map[string]error{"ok": nil, "small_order": ErrSmallOrder, "not_a_point": ErrNotCanonical}
	small := 0
	for _, v := range file.Keys {
		key, err := hex.DecodeString(v.Key)
		if err != nil {
			t.Fatal(err)
		}
		w, ok := want[v.Verdict]
		if !ok {
			t.Fatalf("%s: verdict %q", v.Key, v.Verdict)
		}
		if err := Check(key); !errors.Is(err, w) || (w == nil) != (err == nil) {
			t.Errorf("%s (%s): %v, want %s", v.Key, v.Note, err, v.Verdict)
		}
		if v.Verdict == "small_order" {
			small++
		}
	}
	if small < 8 {
		t.Errorf("the vectors hold %d small-order points, want all 8", small)
	}
}
