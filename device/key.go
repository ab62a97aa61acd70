package device

import "hash/maphash"

// Key names one device: its household and its name within it.
type Key struct {
	Household string
	Device    string
}

// KeyOf returns the key of household's device name.
func KeyOf(household, name string) Key { return Key{Household: household, Device: name} }

// Hash returns k's hash under seed, for sharding maps of devices: the two names
// are mixed unevenly, so that (a, b) and (b, a) land apart.
func (k Key) Hash(seed maphash.Seed) uint64 {
	return maphash.String(seed, k.Household)*0x9e3779b97f4a7c15 + maphash.String(seed, k.Device)
}

// ValidName says whether n may name a household or a device: 1 to 64
// characters of A-Z a-z 0-9 . _ -
func ValidName(n string) bool {
	if len(n) < 1 || len(n) > 64 {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
