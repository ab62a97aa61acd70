// Package check judges a run: each accepted send must arrive exactly once,
// at its recipient, in order, with the payload sent, and nothing else may
// arrive. It holds the record it judges (each send as its sender saw it,
// each arrival as its recipient saw it, and the recipient's lives), and
// turns the run's figures and its verdict into the report.
package check

import (
	"time"
)

// Outcome is how the relay answered a send.
type Outcome int

// The outcomes of a send.
const (
	NotSent  Outcome = iota
	Accepted         // 202
	Refused          // 429 or 503: admission, not a fault
	Failed           // any other answer
	Unknown          // no answer: the relay may or may not have committed
)

// Send is one scheduled send, as the sender saw it.
type Send struct {
	Pair      int
	Scheduled time.Time
	Started   time.Time
	Answered  time.Time
	FirstAt   time.Time // when a poll first carried it
	Outcome   Outcome
	Seq       int64
	Delivered int
}

// Arrival is one envelope as a recipient saw it.
type Arrival struct {
	Send int // index into the sends, -1 when the id is not one of ours
	ID   string
	Seq  int64
	From string
	At   time.Time
	// Asked is when the poll that brought it was sent: a poll sent before
	// a kill may bring what the killed relay wrote, read after the kill.
	Asked time.Time
	// Resyncs is how many times the recipient had resynchronised (a 409
	// cursor_ahead, then a poll without cursor and epoch) when the poll
	// that brought it was sent: across one, seqs may go back and the
	// relay may hand again what it handed before.
	Resyncs int
	Payload bool // the payload is the one sent under ID
	Life    int  // the recipient's registration (index into its lives) that polled
}

// Since returns the earliest the relay can have handed a over: when its poll
// was sent. An answer the killed relay wrote just before the kill may be
// read just after it.
func (a Arrival) Since() time.Time {
	if a.Asked.IsZero() {
		return a.At
	}
	return a.Asked
}

// Recipient is what one pair's recipient saw over the run.
type Recipient struct {
	Idx    int    // the pair's index, as Send.Pair names it
	Sender string // the pair's sender, whom its envelopes must come from
	// Lives are the recipient's registrations, oldest first: a campaign's
	// removal ends one, and a registration with a fresh token begins the
	// next. Without a campaign there is one; none at all (as in tests) is
	// one never removed.
	Lives []*Life
	// Crashes are when the recipient's client crashed and lost its place.
	Crashes  []time.Time
	Received []Arrival
}

// Payload returns the body sent under id: the id followed by a filler that
// depends on it, so that the recipient can check every byte.
func Payload(id string, size int) []byte {
	b := make([]byte, max(size, len(id)))
	n := copy(b, id)
	for j := n; j < len(b); j++ {
		b[j] = 'a' + byte((j+len(id))%26)
	}
	return b
}
