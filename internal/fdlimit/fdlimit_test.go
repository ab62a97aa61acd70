package fdlimit

import (
	"syscall"
	"testing"
)

func TestRaise(t *testing.T) {
	got, err := Raise()
	if err != nil {
		t.Fatal(err)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if got != lim.Cur || lim.Cur != lim.Max {
		t.Fatalf("Raise = %d; limit now %d of %d", got, lim.Cur, lim.Max)
	}
}

// TestRaiseTo: a need at or below the hard limit leaves the hard limit as
// it is; one above it is met where the process may raise it (as root).
func TestRaiseTo(t *testing.T) {
	_, hard, err := Current()
	if err != nil {
		t.Fatal(err)
	}
	soft, got, err := RaiseTo(hard)
	if err != nil || soft != hard || got != hard {
		t.Fatalf("RaiseTo(%d) = %d, %d, %v", hard, soft, got, err)
	}
	soft, got, err = RaiseTo(hard + 1)
	if err != nil || soft != got || got < hard {
		t.Fatalf("RaiseTo(%d) = %d, %d, %v", hard+1, soft, got, err)
	}
	if s, h, _ := Current(); s != soft || h != got {
		t.Fatalf("Current = %d, %d; RaiseTo said %d, %d", s, h, soft, got)
	}
}

func TestBudget(t *testing.T) {
	b := Budget{PerPoll: 2, Reserved: 600}
	tests := []struct {
		limit uint64
		want  int
	}{{1024, 212}, {600, 0}, {100, 0}, {65536, 32468}}
	for _, tt := range tests {
		if got := b.HeldPolls(tt.limit); got != tt.want {
			t.Errorf("HeldPolls(%d) = %d, want %d", tt.limit, got, tt.want)
		}
		if tt.want > 0 && b.Need(tt.want) > tt.limit {
			t.Errorf("Need(%d) = %d exceeds the limit %d it came from", tt.want, b.Need(tt.want), tt.limit)
		}
	}
}
