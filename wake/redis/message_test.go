package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/wake"
)

func TestMessageRoundTrip(t *testing.T) {
	id := instanceID{1, 2, 3, 4, 5, 6, 7, 8}
	ws := []wake.Wake{
		{Key: device.Key{Household: "home", Device: "phone"}, Head: 42},
		{Key: device.Key{Household: "h", Device: strings.Repeat("d", 300)}, Head: 1 << 40, Envelope: []byte("an envelope\x00of any bytes")},
		{Key: device.Key{Household: "home", Device: "phone"}, Life: device.LifeAfter(time.UnixMicro(1700000000123456)), Head: 1},
		{Key: device.Key{Household: "home", Device: "tab"}, Head: 2, Push: device.PushTarget{Kind: device.PushWebPush, Address: "https://push.example/x\nkey\nauth"}},
	}
	b := header(kindWakes, id)
	for _, w := range ws {
		b = appendWake(b, w)
	}
	m, err := parse(string(b))
	if err != nil || m.kind != kindWakes || m.from != id {
		t.Fatalf("parse = %+v, %v", m, err)
	}
	for _, want := range ws {
		got, err := m.nextWake()
		if err != nil || got.Key != want.Key || got.Life != want.Life || got.Head != want.Head || string(got.Envelope) != string(want.Envelope) || got.Push != want.Push {
			t.Fatalf("got %+v %v, want %+v", got, err, want)
		}
	}
	if !m.empty() {
		t.Fatal("bytes left over")
	}

	m, _ = parse(string(appendPresence(header(kindPresence, id), ws[0].Key, 1700000000123456789)))
	if k, _ := m.nextKey(); k != ws[0].Key {
		t.Fatalf("presence: key %v", k)
	}
	if ns, err := m.nextInt(); err != nil || ns != 1700000000123456789 || !m.empty() {
		t.Fatalf("presence: %d %v", ns, err)
	}

	at := time.Unix(1700000000, 5)
	m, _ = parse(string(appendRemoval(header(kindRemoval, id), ws[0].Key, at)))
	k, _ := m.nextKey()
	ns, err := m.nextInt()
	if err != nil || k != ws[0].Key || !time.Unix(0, ns).Equal(at) {
		t.Fatalf("removal: %v %d %v", k, ns, err)
	}
}

// Anything on the channel that is not a whole message is refused, never a
// panic: a cut payload, a length past the end, a short header.
func TestMessageMalformed(t *testing.T) {
	good := string(appendWake(header(kindWakes, instanceID{}), wake.Wake{Key: device.Key{Household: "home", Device: "phone"}, Head: 3, Envelope: []byte("env")}))
	for n := range len(good) {
		m, err := parse(good[:n])
		if err != nil {
			continue
		}
		if _, err := m.nextWake(); err == nil && m.empty() {
			t.Fatalf("a payload cut to %d of %d bytes parsed whole", n, len(good))
		}
	}
	m, _ := parse(string(header(kindWakes, instanceID{})) + "\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")
	if _, err := m.nextString(); err == nil {
		t.Fatal("a huge length parsed")
	}
}

func FuzzParse(f *testing.F) {
	f.Add(string(appendWake(header(kindWakes, instanceID{}), wake.Wake{Key: device.Key{Household: "a", Device: "b"}, Head: 1})))
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parse(s)
		if err != nil {
			return
		}
		for !m.empty() {
			if _, err := m.nextWake(); err != nil {
				return
			}
		}
	})
}

// The slot function is Redis Cluster's (CRC16-XMODEM, whose check value
// for "123456789" is 0x31C3), and each shard channel's slot lies in its
// own share of the slot range.
func TestChannelNames(t *testing.T) {
	if got := slot("123456789"); got != 0x31C3 {
		t.Fatalf("slot(123456789) = %#x, want 0x31c3", got)
	}
	for _, shards := range []int{1, 3, 16, 1024} {
		names := channelNames("fn:wake:", shards)
		seen := map[string]bool{}
		for i, n := range names {
			tag := n[strings.Index(n, "{")+1 : strings.Index(n, "}")]
			if s := slot(tag); s < i*slotCount/shards || s >= (i+1)*slotCount/shards {
				t.Fatalf("%d shards: %s has slot %d, outside shard %d's range", shards, n, s, i)
			}
			if seen[n] || !strings.HasPrefix(n, "fn:wake:{") {
				t.Fatalf("%d shards: bad or repeated name %s", shards, n)
			}
			seen[n] = true
		}
	}
}

func TestShardOf(t *testing.T) {
	a := shardOf(device.Key{Household: "ab", Device: "c"}, 16)
	if a != shardOf(device.Key{Household: "ab", Device: "c"}, 16) {
		t.Fatal("shardOf is not stable")
	}
	hits := make([]int, 16)
	for i := range 1600 {
		hits[shardOf(device.Key{Household: "home", Device: strings.Repeat("x", i%7) + string(rune('a'+i%26)) + strings.Repeat("y", i/26)}, 16)]++
	}
	for s, n := range hits {
		if n < 50 {
			t.Fatalf("shard %d got %d of 1600 devices", s, n)
		}
	}
}
