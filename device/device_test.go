package device

import (
	"hash/maphash"
	"strings"
	"testing"
	"time"
)

// TestLifeAdmits: a token belongs to a life when it was issued after the
// removal that began it; a token without an issue time only to a name
// never removed. Admitting a token issued at the removal's own microsecond
// would let a token minted in the same instant outlive the removal.
func TestLifeAdmits(t *testing.T) {
	removed := time.Date(2026, 12, 1, 12, 0, 0, 123456789, time.UTC)
	life := LifeAfter(removed)
	for _, tt := range []struct {
		name   string
		life   Life
		issued time.Time
		want   bool
	}{
		{"never removed, any token", Life{}, removed.Add(-time.Hour), true},
		{"never removed, no iat", Life{}, time.Time{}, true},
		{"issued before", life, removed.Add(-time.Second), false},
		{"issued at the removal", life, removed.Truncate(time.Microsecond), false},
		{"issued a microsecond after", life, removed.Truncate(time.Microsecond).Add(time.Microsecond), true},
		{"no iat once removed", life, time.Time{}, false},
	} {
		if got := tt.life.Admits(tt.issued); got != tt.want {
			t.Errorf("%s: Admits = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestLifeOrder: lives compare by their removals, to the microsecond the
// stores keep, whatever the time zone they were read in.
func TestLifeOrder(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 123456789, time.UTC)
	a := LifeAfter(at)
	b := LifeAfter(at.In(time.FixedZone("x", 3600)).Truncate(time.Microsecond))
	if a != b || a.Compare(b) != 0 {
		t.Fatalf("the same removal read twice: %v, %v", a, b)
	}
	later := LifeAfter(at.Add(time.Millisecond))
	if a.Compare(later) != -1 || later.Compare(a) != 1 || a.Later(later) != later || later.Later(a) != later {
		t.Fatal("a later removal is not a later life")
	}
	if !(Life{}).IsZero() || (Life{}).Compare(a) != -1 || LifeAfter(time.Time{}) != (Life{}) {
		t.Fatal("the first life is not the earliest")
	}
}

func TestValidName(t *testing.T) {
	for _, n := range []string{"a", "phone", "A-Z_0.9", strings.Repeat("x", 64)} {
		if !ValidName(n) {
			t.Errorf("ValidName(%q) = false", n)
		}
	}
	for _, n := range []string{"", strings.Repeat("x", 65), "a b", "a/b", "ü", "a\x00"} {
		if ValidName(n) {
			t.Errorf("ValidName(%q) = true", n)
		}
	}
}

// TestKeyHash: the two names are not interchangeable in the hash.
func TestKeyHash(t *testing.T) {
	seed := maphash.MakeSeed()
	if KeyOf("a", "b").Hash(seed) == KeyOf("b", "a").Hash(seed) {
		t.Fatal("(a, b) and (b, a) hash alike")
	}
	k := KeyOf("h", "d")
	if k.Hash(seed) != (Key{Household: "h", Device: "d"}).Hash(seed) {
		t.Fatal("one key hashes two ways")
	}
}
