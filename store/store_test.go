package store

import "testing"

func TestDigest(t *testing.T) {
	base := Digest([]string{"a", "b"}, []byte("xy"))
	for name, other := range map[string][32]byte{
		"bytes moved between names":        Digest([]string{"ab"}, []byte("xy")),
		"bytes moved from name to payload": Digest([]string{"a"}, []byte("bxy")),
		"other payload":                    Digest([]string{"a", "b"}, []byte("xz")),
		"other recipients":                 Digest([]string{"a", "c"}, []byte("xy")),
	} {
		if other == base {
			t.Errorf("%s: same digest", name)
		}
	}
	if Digest([]string{"a", "b"}, []byte("xy")) != base {
		t.Error("the same send digests differently")
	}
}

func TestRecipients(t *testing.T) {
	in := []string{"phone", "laptop", "phone", "Tablet"}
	got := Recipients(in)
	if want := []string{"Tablet", "laptop", "phone"}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("Recipients = %v, want %v", got, want)
	}
	if in[0] != "phone" || in[2] != "phone" {
		t.Fatalf("Recipients changed its argument: %v", in)
	}
}
