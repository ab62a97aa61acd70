package check

import "time"

// Life is when one registration of a pair's recipient lasted. Sends to it
// are judged by when they ran: one that overlapped only a life never
// removed must arrive exactly once.
type Life struct {
	// Registering and Registered bound the registration that began it
	// (zero for the first, which precedes every send); Removing and
	// Removed bound the removal that ended it (zero while it lasts).
	Registering, Registered time.Time
	Removing, Removed       time.Time
}

// MayHold reports whether s, which ran over [s.Started, s.Answered], may
// have been stored for this life: the send and the life overlap.
func (l *Life) MayHold(s Send) bool {
	return (l.Removed.IsZero() || !s.Started.After(l.Removed)) && !s.Answered.Before(l.Registering)
}

// Ended reports whether a removal of the life has begun.
func (l *Life) Ended() bool { return !l.Removing.IsZero() }

// Fate is what the checks expect of an accepted send, from the lives it
// overlapped.
type Fate int

const (
	// Owed: it overlapped only a life never removed, so it must arrive
	// exactly once.
	Owed Fate = iota
	// Excused: every life it overlapped was removed, and its envelope may
	// have gone with it.
	Excused
	// Straddling: it overlapped a removed life and the one after, which
	// the relay may have stored it for; it is not owed.
	Straddling
	// Homeless: no life existed while it ran, yet the relay accepted it.
	Homeless
)

// FateOf returns s's fate among lives; whoever may change them meanwhile must
// hold them still. No lives (the check tests' pairs) is one life never
// removed.
func FateOf(s Send, lives []*Life) Fate {
	var live, gone int
	for _, l := range lives {
		if !l.MayHold(s) {
			continue
		}
		if l.Ended() {
			gone++
		} else {
			live++
		}
	}
	switch {
	case len(lives) == 0 || live > 0 && gone == 0:
		return Owed
	case live > 0:
		return Straddling
	case gone > 0:
		return Excused
	default:
		return Homeless
	}
}

// AbsentDuring reports whether the recipient of lives was removed, and not
// yet registered again, at some time in [from, to].
func AbsentDuring(lives []*Life, from, to time.Time) bool {
	for i, l := range lives {
		if !l.Ended() || to.Before(l.Removing) {
			continue
		}
		if i+1 == len(lives) || !from.After(lives[i+1].Registered) {
			return true
		}
	}
	return false
}
