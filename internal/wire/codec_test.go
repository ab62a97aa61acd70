package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// nested is depth one-element arrays around nil.
func nested(depth int) []byte { return append(bytes.Repeat([]byte{0x91}, depth), 0xc0) }

// inMap is a MessagePack map of one key, "k", to the raw value v.
func inMap(v []byte) []byte { return append([]byte{0x81, 0xa1, 'k'}, v...) }

// TestCheckMsgpack: the shapes that once cost the relay more than the body
// are refused, their honest neighbours accepted, and the walk allocates
// nothing. Removing the length check or the trailing bytes test, raising
// the depth limit to 33, or not doubling a map's count each turned cases
// here red.
func TestCheckMsgpack(t *testing.T) {
	u32 := func(code byte, n uint32) []byte { return binary.BigEndian.AppendUint32([]byte{code}, n) }
	tests := []struct {
		name string
		b    []byte
		ok   bool
	}{
		{"bin32 of 4 GiB", u32(0xc6, 0xffffffff), false},
		{"bin32 one short", append(u32(0xc6, 3), 1, 2), false},
		{"bin32 exact", append(u32(0xc6, 3), 1, 2, 3), true},
		{"str32 of 4 GiB", u32(0xdb, 0xffffffff), false},
		{"ext32 of 4 GiB", append(u32(0xc9, 0xffffffff), 1), false},
		{"ext8 without its type byte", []byte{0xc7, 1, 0}, false},
		{"ext8", []byte{0xc7, 1, 5, 0}, true},
		{"fixext16 short", append([]byte{0xd8, 1}, make([]byte, 15)...), false},
		{"fixext16", append([]byte{0xd8, 1}, make([]byte, 16)...), true},
		{"array32 of 4G values", u32(0xdd, 0xffffffff), false},
		{"array32 one value short", append(u32(0xdd, 3), 1, 2), false},
		{"array32 exact", append(u32(0xdd, 3), 1, 2, 3), true},
		{"map32 of 4G entries", u32(0xdf, 0xffffffff), false},
		{"map32 whose count fits as values, not pairs", append(u32(0xdf, 2), 1, 2, 3), false},
		{"map32 exact", append(u32(0xdf, 2), 1, 2, 3, 4), true},
		{"float64 short", []byte{0xcb, 0, 0, 0, 0, 0, 0, 0}, false},
		{"int64", []byte{0xd3, 0, 0, 0, 0, 0, 0, 0, 0}, true},
		{"32 levels", nested(32), true},
		{"33 levels", nested(33), false},
		{"33 levels in a map", inMap(nested(32)), false},
		{"32 levels in a map", inMap(nested(31)), true},
		{"trailing nil", []byte{0xc0, 0xc0}, false},
		{"empty", nil, false},
		{"0xc1", []byte{0xc1}, false},
		{"fixmap missing a value", []byte{0x81, 0xc0}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := checkMsgpack(tt.b); (err == nil) != tt.ok {
				t.Fatalf("checkMsgpack(% x) = %v, want ok %v", tt.b, err, tt.ok)
			}
			if n := testing.AllocsPerRun(10, func() { _ = checkMsgpack(tt.b) }); n != 0 {
				t.Fatalf("%v allocations", n)
			}
		})
	}
}

// TestCheckMsgpackEveryType: for every first byte, followed by zeros (so
// every declared length is 0 and the decoder never reads far), the check
// accepts exactly what the decoder reads as one whole value.
func TestCheckMsgpackEveryType(t *testing.T) {
	for c := range 256 {
		for zeros := range 40 {
			b := append([]byte{byte(c)}, make([]byte, zeros)...)
			r := bytes.NewReader(b)
			skipErr := msgpack.NewDecoder(r).Skip()
			whole := skipErr == nil && r.Len() == 0
			if err := checkMsgpack(b); (err == nil) != whole {
				t.Fatalf("checkMsgpack(% x) = %v; decoder: %v, %d bytes left", b, err, skipErr, r.Len())
			}
		}
	}
}

// FuzzCheckMsgpack: checkMsgpack accepts exactly what the decoder reads as
// one whole value, less what nests too deep. The decoder's Skip is safe to
// run on any input: it reads declared lengths in bounded chunks.
func FuzzCheckMsgpack(f *testing.F) {
	seed, err := msgpack.Marshal(map[string]any{"id": "a", "to": []string{"phone"}, "payload": []byte("x"), "n": 1.5, "t": time.Unix(1, 2), "m": map[string]any{"k": []any{int64(-1), uint64(1 << 40), nil, true}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{0xc7, 0x01, 0x05, 0x00, 0xd8, 0x01})
	f.Add(nested(32))
	f.Add(nested(33))
	f.Add([]byte{0xdf, 0, 0, 0, 1, 0xc0})
	f.Fuzz(func(t *testing.T, b []byte) {
		err := checkMsgpack(b)
		r := bytes.NewReader(b)
		skipErr := msgpack.NewDecoder(r).Skip()
		whole := skipErr == nil && r.Len() == 0
		if err == nil && !whole {
			t.Fatalf("accepted % x; the decoder says %v with %d bytes left", b, skipErr, r.Len())
		}
		if err != nil && whole && !errors.Is(err, errMsgpackTooDeep) {
			t.Fatalf("refused % x (%v); the decoder reads it whole", b, err)
		}
	})
}
