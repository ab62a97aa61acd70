package seal_test

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"

	"github.com/flamenet/relay/seal"
)

// FuzzOpen: whatever bytes arrive, Open returns, without panicking, either
// a plaintext or exactly one of the format's errors. The seeds are the
// committed vectors.
func FuzzOpen(f *testing.F) {
	b, err := os.ReadFile(vectorsPath)
	if err != nil {
		f.Fatal(err)
	}
	var v vectorFile
	if err := json.Unmarshal(b, &v); err != nil {
		f.Fatal(err)
	}
	for _, x := range append(v.Valid, v.Invalid...) {
		if x.Household == "home" && x.Opener == "phone" {
			sealed, _ := hex.DecodeString(x.Sealed)
			f.Add(x.ID, x.From, sealed)
		}
	}
	phone := identity(f, "phone")
	pins := map[string][]byte{"laptop": identity(f, "laptop").Public(), "phone": phone.Public(), "tablet": identity(f, "tablet").Public()}
	f.Fuzz(func(t *testing.T, id, from string, sealed []byte) {
		pt, err := seal.Open(seal.OpenParams{Household: "home", Device: "phone", Identity: phone, ID: id, From: from, SenderKey: pins[from], Sealed: sealed})
		if (err == nil) == (seal.Code(err) != "") || (err == nil && pt == nil) || (err != nil && pt != nil) {
			t.Fatalf("plaintext %q, error %v (code %q)", pt, err, seal.Code(err))
		}
	})
}
