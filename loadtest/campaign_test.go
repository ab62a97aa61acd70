package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/loadtest/internal/stack"
	"github.com/flamenet/relay/loadtest/report"
)

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

// needServices skips without what a campaign starts, or fails under
// FN_TEST_REQUIRE_SERVICES=1.
func needServices(t *testing.T) {
	t.Helper()
	if err := stack.ServicesMissing(); err != nil {
		servicetest.Unavailable(t, "initdb, postgres and redis-server (a fault campaign's own servers)", err)
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
