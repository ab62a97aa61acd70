package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/loadtest/report"
)

func testPlan(seed uint64, kinds ...string) []fault {
	if len(kinds) == 0 {
		kinds = faultKinds
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
	for _, k := range faultKinds {
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

// TestCampaignConfig: -faults brings its own defaults where no flag or
// variable was given, and refuses what it cannot run with.
func TestCampaignConfig(t *testing.T) {
	c, err := parseConfig([]string{"-faults", "0", "-pairs", "40"}, env(map[string]string{"LOAD_RATE": "10"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.faults == nil || *c.faults != 0 || c.store != "postgres" || c.replicas != 3 || c.pairs != 40 || c.rate != 10 || c.wait != 5 ||
		c.drain != 15*time.Second || c.faultGap != time.Second || !slices.Equal(c.faultKinds, faultKinds) {
		t.Errorf("config %+v", c)
	}
	c, err = parseConfig([]string{"-pairs", "40"}, env(nil), &bytes.Buffer{})
	if err != nil || c.faults != nil || c.store != "sqlite" || c.replicas != 1 {
		t.Errorf("without -faults: %+v, %v", c, err)
	}
	c, err = parseConfig([]string{"-faults", "18446744073709551615", "-fault-kinds", "remove,pg-pause,remove"}, env(nil), &bytes.Buffer{})
	if err != nil || *c.faults != 1<<64-1 || !slices.Equal(c.faultKinds, []string{faultRemove, faultPGPause}) {
		t.Errorf("largest seed, two kinds: %+v, %v", c, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-faults", "x"}, "seed"},
		{[]string{"-faults", "-1"}, "seed"},
		{[]string{"-faults", "1", "-fault-kinds", "pg-kil"}, "fault kinds"},
		{[]string{"-fault-kinds", "remove"}, "needs -faults"},
		{[]string{"-faults", "1", "-store", "sqlite"}, "-store postgres"},
		{[]string{"-faults", "1", "-replicas", "1"}, "-replicas 2"},
		{[]string{"-faults", "1", "-crash", "5s"}, "-crash"},
		{[]string{"-faults", "1", "-hostile", "2"}, "-hostile"},
		{[]string{"-faults", "1", "-pg", "postgres://x@127.0.0.1/y"}, "-pg"},
		{[]string{"-faults", "1", "-url", "http://127.0.0.1:1", "-issuer-key", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}, "throwaway"},
		{[]string{"-faults", "1", "-fault-gap", "0"}, "-fault-gap"},
		{[]string{"-faults", "1", "-duration", "4s"}, "-duration"},
	} {
		_, err := parseConfig(tc.args, env(nil), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}

// campaignSeeds run in CI. With TestCampaign's flags each plans every
// kind of fault (22 to 31 of them), removals among them while Postgres or
// Redis is down or paused, and together they kill each of the three
// relays.
var campaignSeeds = []uint64{1, 7, 8}

// TestCampaign runs a short fault campaign per seed against relays built
// from this checkout and fails on any violation. A failing seed replays
// with the command in the log.
func TestCampaign(t *testing.T) {
	bin := needRelay(t)
	needServices(t)
	for _, seed := range campaignSeeds {
		t.Run("seed="+strconv.FormatUint(seed, 10), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "report.json")
			args := []string{"-relay-bin", bin, "-faults", strconv.FormatUint(seed, 10),
				"-duration", "30s", "-pairs", "100", "-wait", "3", "-out", out, "-progress", "5s"}
			var stdout, stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			err := run(ctx, args, func(string) string { return "" }, &stdout, &stderr)
			rep, rerr := report.Read(out)
			if rerr != nil {
				t.Fatalf("run: %v; report: %v\nstderr:\n%s", err, rerr, stderr.String())
			}
			t.Logf("%s", stdout.String())
			c := rep.Campaign
			if c == nil || c.Seed != strconv.FormatUint(seed, 10) || len(c.Faults) == 0 {
				t.Fatalf("campaign %+v", c)
			}
			if err != nil || !rep.OK {
				var plan []string
				for _, f := range c.Faults {
					plan = append(plan, fmt.Sprintf("%s (began %.3f s, healed %.3f s) %s", f.Plan, f.StartedSeconds, f.HealedSeconds, f.Error))
				}
				t.Errorf("seed %d: %v\n%s\nreplay: go run ./loadtest %s\nplan:\n%s\nwarnings and errors:\n%s",
					seed, err, strings.Join(rep.Failures, "\n"), strings.TrimPrefix(c.Replay, "loadtest "),
					strings.Join(plan, "\n"), notices(stderr.String(), 40))
			}
			for _, f := range c.Faults {
				if f.StartedSeconds == 0 && f.HealedSeconds == 0 {
					t.Errorf("fault never ran: %+v", f)
				}
			}
			if rep.Accepted == 0 || c.Owed == 0 || rep.Delivered < c.Owed {
				t.Errorf("accepted %d, owed %d, delivered %d", rep.Accepted, c.Owed, rep.Delivered)
			}
		})
	}
}

// notices are the last n lines of a run's log above INFO.
func notices(log string, n int) string {
	var out []string
	for line := range strings.SplitSeq(log, "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			out = append(out, line)
		}
	}
	return strings.Join(out[max(0, len(out)-n):], "\n")
}

// TestStaleAnswer: another relay may accept a removed device's old token
// until the removal can have reached it, staleGrace after the 204 or
// longer while a fault of that relay, Postgres or Redis delays the news;
// after that, accepting it is a violation.
func TestStaleAnswer(t *testing.T) {
	r := testRunner(t, []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}, 1)
	r.campaign = &campaign{violations: map[string]int{}, stale: map[string]int{}}
	removed := time.Now()
	r.start = removed.Add(-10 * time.Second)
	p := r.pairs[0]
	l := p.lives[0]
	l.removing, l.removed = removed.Add(-time.Millisecond), removed
	// Relay 1 was paused from 1 s to 3 s after the removal.
	r.windows = []window{{from: removed.Add(time.Second), to: removed.Add(3 * time.Second), relays: []int{1}, retryableOnly: true}}
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
		r.campaign.violations = map[string]int{}
		r.staleAnswerLocked(p, l, "poll", tc.relay, removed.Add(tc.after))
		if got := len(r.campaign.violations) > 0; got != tc.violates {
			t.Errorf("%s: violation %v, want %v (%v)", tc.name, got, tc.violates, r.campaign.examples)
		}
	}
}
