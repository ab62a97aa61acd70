// Package device holds what every layer of the relay says about a device
// and needs to say the same way: its [Key], the name rule ([ValidName]),
// its [Life] and its [PushTarget]. Apps that name devices use the rule the
// relay holds them to; the seal package names its recipients by it.
package device

import "time"

// Life is one life of a device name. A removal ends a device; a later
// registration under the same name starts a new life, whose seqs begin
// again at 1. A life is named by the removal that began it (the zero Life:
// the name was never removed).
//
// Everything the relay keeps or passes about a device (a wake, a position
// in memory, an envelope kept for a poll, a queued ack) carries the Life it
// belongs to, so that news of an earlier life is never applied to a later
// one, and a token issued before a removal never acts on the name again.
type Life struct {
	removed time.Time // UTC, to the microsecond as the stores keep it; zero: never removed
}

// LifeAfter returns the life begun by a removal at removed (zero: never
// removed).
func LifeAfter(removed time.Time) Life {
	if removed.IsZero() {
		return Life{}
	}
	return Life{removed: removed.UTC().Truncate(time.Microsecond)}
}

// RemovedAt returns the removal that began the life; zero if the name was
// never removed.
func (l Life) RemovedAt() time.Time { return l.removed }

// Admits reports whether a token issued at issuedAt may act in this life:
// it was issued after the removal that began it. A token without an issue
// time (zero) is admitted only by a name that was never removed.
func (l Life) Admits(issuedAt time.Time) bool {
	return l.removed.IsZero() || (!issuedAt.IsZero() && issuedAt.After(l.removed))
}

// Compare returns -1 when l is an earlier life than o, +1 when later, 0 when
// they are the same life.
func (l Life) Compare(o Life) int { return l.removed.Compare(o.removed) }

// Later returns the later of l and o.
func (l Life) Later(o Life) Life {
	if o.Compare(l) > 0 {
		return o
	}
	return l
}

// IsZero reports whether the name was never removed.
func (l Life) IsZero() bool { return l.removed.IsZero() }

// String returns the removal's time, or "first" for a name never removed.
func (l Life) String() string {
	if l.removed.IsZero() {
		return "first"
	}
	return "after " + l.removed.Format(time.RFC3339Nano)
}
