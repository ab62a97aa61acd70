package main

import (
	"context"
	"time"

	"github.com/flamenet/relay/client"
)

// life is one registration of a pair's recipient, with a token of its
// own. Sends to it are judged by when they ran: one that overlapped only
// a life never removed must arrive exactly once.
type life struct {
	token  string
	client *client.Client
	// registering and registered bound the registration that began it
	// (zero for the first, which precedes every send); removing and
	// removed bound the removal that ended it (zero while it lasts).
	registering, registered time.Time
	removing, removed       time.Time
	cursor                  int64  // where its registration put the cursor
	epoch                   string // and in which store epoch
	// ctx ends when the next life begins, and with it the old token's
	// polls.
	ctx context.Context
	end context.CancelFunc
}

func newLife(token string, c *client.Client) *life {
	l := &life{token: token, client: c}
	l.ctx, l.end = context.WithCancel(context.Background())
	return l
}

// mayHold reports whether a send that ran over [rec.started, rec.answered]
// may have been stored for this life: the send and the life overlap.
func (l *life) mayHold(rec sendRecord) bool {
	return (l.removed.IsZero() || !rec.started.After(l.removed)) && !rec.answered.Before(l.registering)
}

// ended reports whether a removal of the life has begun.
func (l *life) ended() bool { return !l.removing.IsZero() }

// fate is what the checks expect of an accepted send, from the lives it
// overlapped.
type fate int

const (
	// owed: it overlapped only a life never removed, so it must arrive
	// exactly once.
	owed fate = iota
	// excused: every life it overlapped was removed, and its envelope may
	// have gone with it.
	excused
	// straddling: it overlapped a removed life and the one after, which
	// the relay may have stored it for; it is not owed.
	straddling
	// homeless: no life existed while it ran, yet the relay accepted it.
	homeless
)

// fateOf is rec's fate among lives; the caller holds mu while they may
// change. No lives (the check tests' pairs) is one life never removed.
func fateOf(rec sendRecord, lives []*life) fate {
	var live, gone int
	for _, l := range lives {
		if !l.mayHold(rec) {
			continue
		}
		if l.ended() {
			gone++
		} else {
			live++
		}
	}
	switch {
	case len(lives) == 0 || live > 0 && gone == 0:
		return owed
	case live > 0:
		return straddling
	case gone > 0:
		return excused
	default:
		return homeless
	}
}

// absentDuring reports whether the recipient was removed, and not yet
// registered again, at some time in [from, to]; the caller holds mu.
func (p *pair) absentDuring(from, to time.Time) bool {
	for i, l := range p.lives {
		if !l.ended() || to.Before(l.removing) {
			continue
		}
		if i+1 == len(p.lives) || !from.After(p.lives[i+1].registered) {
			return true
		}
	}
	return false
}
