package faults

import (
	"slices"
	"testing"
	"time"

	"github.com/flamenet/relay/loadtest/internal/tally"
)

func testPlan(seed uint64, kinds ...string) []fault {
	if len(kinds) == 0 {
		kinds = FaultKinds
	}
	return planFaults(planParams{seed: seed, duration: 60 * time.Second, gap: time.Second, replicas: 3, pairs: 160, kinds: kinds})
}

// TestPlanReplays: a seed is its plan. Faults of one component never
// overlap, every fault is over two seconds before the sends end, and the
// targets are the stack's.
func TestPlanReplays(t *testing.T) {
	a, b := testPlan(7), testPlan(7)
	if !slices.Equal(a, b) {
		t.Fatalf("seed 7 planned twice differs:\n%v\n%v", a, b)
	}
	if slices.Equal(a, testPlan(8)) {
		t.Errorf("seeds 7 and 8 planned the same")
	}
	kinds := map[string]int{}
	free := map[string]time.Duration{}
	for i, f := range a {
		kinds[f.Kind]++
		if i > 0 && f.At < a[i-1].At {
			t.Errorf("fault %d (%v) before the one planned before it", i, f)
		}
		if f.At < time.Second || f.At+f.Hold+faultShape[f.Kind].settle > 58*time.Second {
			t.Errorf("fault %v is not within 1 s and 58 s", f)
		}
		if f.At < free[f.component()] {
			t.Errorf("fault %v begins while its %s is busy until %v", f, f.component(), free[f.component()])
		}
		free[f.component()] = f.At + f.Hold + faultShape[f.Kind].settle
		relays := []int{f.Via, f.Stale, f.Register}
		switch f.Kind {
		case faultRelayKill, faultRelayPause:
			relays = append(relays, f.Target)
		case faultRemove, faultClientCrash:
			if f.Target < 0 || f.Target >= 160 {
				t.Errorf("fault %v targets no pair", f)
			}
		default:
			if f.Target != -1 {
				t.Errorf("fault %v has a target", f)
			}
		}
		for _, i := range relays {
			if i < 0 || i >= 3 {
				t.Errorf("fault %v names relay %d of 3", f, i)
			}
		}
	}
	// Seed 7 over a minute draws every kind, removals most.
	for _, k := range FaultKinds {
		if kinds[k] == 0 {
			t.Errorf("seed 7 planned no %s: %v", k, kinds)
		}
	}
	if kinds[faultRemove] <= kinds[faultPGKill] {
		t.Errorf("removals %d, Postgres kills %d: removals weigh more", kinds[faultRemove], kinds[faultPGKill])
	}
	for _, f := range testPlan(7, faultRedisPause) {
		if f.Kind != faultRedisPause {
			t.Errorf("only redis-pause asked for, planned %v", f)
		}
	}
}

func TestReplayCommand(t *testing.T) {
	got := replayCommand([]string{"LOAD_PAIRS=20", "loadtest", "-faults", "3", "-out", "r.json", "-name=x", "-duration", "30s"})
	if want := "LOAD_PAIRS=20 loadtest -faults 3 -duration 30s"; got != want {
		t.Errorf("replay = %q, want %q", got, want)
	}
}

// TestStaleAnswer: another relay may accept a removed device's old token
// until the removal can have reached it, staleGrace after the 204 or
// longer while a fault of that relay, Postgres or Redis delays the news;
// after that, accepting it is a violation.
func TestStaleAnswer(t *testing.T) {
	tl := tally.New(tally.Config{Lives: true})
	tl.AddPair("s0", "r0")
	removed := time.Now()
	li := tl.BeginRemoval(0, removed.Add(-time.Millisecond))
	tl.RemovalAnswered(0, li, removed, false)
	// Relay 1 was paused from 1 s to 3 s after the removal.
	w := tl.OpenWindow(removed.Add(time.Second), []int{1}, true)
	tl.CloseWindow(w, removed.Add(3*time.Second), true)
	c := &Campaign{tally: tl, start: removed.Add(-10 * time.Second), violations: map[string]int{}, stale: map[string]int{}}
	for _, tc := range []struct {
		name     string
		relay    int
		after    time.Duration
		violates bool
	}{
		{"before the removal's answer", 0, -time.Millisecond, false},
		{"just after, at a relay that has not heard", 0, 500 * time.Millisecond, false},
		{"a second later with wake-ups flowing", 0, 2 * time.Second, true},
		{"while the relay was paused", 1, 2 * time.Second, false},
		{"within a second of the pause's end", 1, 3500 * time.Millisecond, false},
		{"over a second after it", 1, 4500 * time.Millisecond, true},
	} {
		c.violations = map[string]int{}
		c.Accepted(0, li, "r0", "poll", tc.relay, removed.Add(tc.after))
		if got := len(c.violations) > 0; got != tc.violates {
			t.Errorf("%s: violation %v, want %v (%v)", tc.name, got, tc.violates, c.examples)
		}
	}
}
