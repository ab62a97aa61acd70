package redis

import (
	"encoding/binary"
	"errors"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/wake"
)

// A message on a shard channel is one byte of kind, the sender's instance
// id, then a body:
//
//	'V' wakes:     (household, device, life, head, envelope, push kind,
//	               push address)...   one or more; life is the unix micros
//	               of the removal that began the device's life (0: never
//	               removed); envelope is the relay's own encoding, empty
//	               for none; the push target is empty unless the sender
//	               does not hold the device (see Signal)
//	'P' presence:  household, device, unix nanos: the sender holds the
//	               device's poll since then (see subs.go)
//	'R' removal:   household, device, unix nanos
//	'H' heartbeat: the sender's own clock stamp   (only the sender reads it)
//	'L' lost:      nothing: "I failed to publish wakes; re-read the store"
//
// Strings are a uvarint length and the bytes; numbers are varints. A
// receiver skips its own messages by the id and ignores kinds it does not
// know, so a newer relay may add kinds. ('W', wakes without their life,
// is no longer sent or read.)
const (
	kindWakes    = 'V'
	kindPresence = 'P'
	kindRemoval  = 'R'
	kindBeat     = 'H'
	kindLost     = 'L'
)

// idLen is the length of an instance id: 64 random bits, enough that two
// relays of one fleet never draw the same.
const idLen = 8

type instanceID [idLen]byte

var errMalformed = errors.New("wake: malformed redis message")

func header(kind byte, id instanceID) []byte {
	b := make([]byte, 0, 64)
	b = append(b, kind)
	return append(b, id[:]...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendWake(b []byte, w wake.Wake) []byte {
	b = appendString(b, w.Key.Household)
	b = appendString(b, w.Key.Device)
	var life int64
	if at := w.Life.RemovedAt(); !at.IsZero() {
		life = at.UnixMicro()
	}
	b = binary.AppendVarint(b, life)
	b = binary.AppendVarint(b, w.Head)
	b = binary.AppendUvarint(b, uint64(len(w.Envelope)))
	b = append(b, w.Envelope...)
	b = appendString(b, w.Push.Kind)
	return appendString(b, w.Push.Address)
}

func appendPresence(b []byte, k device.Key, since int64) []byte {
	b = appendString(b, k.Household)
	b = appendString(b, k.Device)
	return binary.AppendVarint(b, since)
}

func appendRemoval(b []byte, k device.Key, at time.Time) []byte {
	b = appendString(b, k.Household)
	b = appendString(b, k.Device)
	return binary.AppendVarint(b, at.UnixNano())
}

func appendStamp(b []byte, stamp int64) []byte { return binary.AppendVarint(b, stamp) }

// message is a parsed payload; body is read with the next* methods.
type message struct {
	kind byte
	from instanceID
	body string
}

func parse(payload string) (message, error) {
	if len(payload) < 1+idLen {
		return message{}, errMalformed
	}
	m := message{kind: payload[0], body: payload[1+idLen:]}
	copy(m.from[:], payload[1:1+idLen])
	return m, nil
}

func (m *message) empty() bool { return len(m.body) == 0 }

// nextString returns a substring of the payload (no copy).
func (m *message) nextString() (string, error) {
	n, w := binary.Uvarint([]byte(m.body[:min(len(m.body), binary.MaxVarintLen64)]))
	if w <= 0 || n > uint64(len(m.body)-w) {
		return "", errMalformed
	}
	s := m.body[w : w+int(n)]
	m.body = m.body[w+int(n):]
	return s, nil
}

func (m *message) nextInt() (int64, error) {
	v, w := binary.Varint([]byte(m.body[:min(len(m.body), binary.MaxVarintLen64)]))
	if w <= 0 {
		return 0, errMalformed
	}
	m.body = m.body[w:]
	return v, nil
}

func (m *message) nextKey() (device.Key, error) {
	h, err := m.nextString()
	if err != nil {
		return device.Key{}, err
	}
	d, err := m.nextString()
	if err != nil {
		return device.Key{}, err
	}
	return device.KeyOf(h, d), nil
}

// nextWake reads one wake of a 'V' message.
func (m *message) nextWake() (wake.Wake, error) {
	k, err := m.nextKey()
	if err != nil {
		return wake.Wake{}, err
	}
	life, err := m.nextInt()
	if err != nil {
		return wake.Wake{}, err
	}
	head, err := m.nextInt()
	if err != nil {
		return wake.Wake{}, err
	}
	env, err := m.nextString()
	if err != nil {
		return wake.Wake{}, err
	}
	kind, err := m.nextString()
	if err != nil {
		return wake.Wake{}, err
	}
	addr, err := m.nextString()
	if err != nil {
		return wake.Wake{}, err
	}
	w := wake.Wake{Key: k, Head: head, Push: device.PushTarget{Kind: kind, Address: addr}}
	if life != 0 {
		w.Life = device.LifeAfter(time.UnixMicro(life))
	}
	if env != "" {
		w.Envelope = []byte(env)
	}
	return w, nil
}

// shardOf maps a device to a shard. Every relay must agree, so that one
// device's wakes and removal travel one channel, in order: hence a fixed
// hash (FNV-1a), not a per-process seed.
func shardOf(k device.Key, shards int) int {
	f := fnv.New64a()
	_, _ = f.Write([]byte(k.Household))
	_, _ = f.Write([]byte{0}) // names cannot contain NUL: ("ab","c") != ("a","bc")
	_, _ = f.Write([]byte(k.Device))
	return int(f.Sum64() % uint64(shards))
}

// channelNames returns the shard channels, prefix + "{tag}". Each tag is
// chosen so that its Redis Cluster slot lies in the shard's own 1/shards of
// the slot range: a cluster created with evenly split slots then gives
// every master its share of channels. Deterministic, so every relay
// computes the same names.
func channelNames(prefix string, shards int) []string {
	names := make([]string, shards)
	for i := range shards {
		lo, hi := i*slotCount/shards, (i+1)*slotCount/shards
		for j := 0; ; j++ {
			tag := strconv.Itoa(i) + "." + strconv.Itoa(j)
			if s := slot(tag); s >= lo && s < hi {
				names[i] = prefix + "{" + tag + "}"
				break
			}
		}
	}
	return names
}

const slotCount = 16384

// slot returns Redis Cluster's key slot of a hash tag's content: CRC16-XMODEM
// modulo 16384.
func slot(tag string) int {
	var crc uint16
	for i := range len(tag) {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % slotCount
}
