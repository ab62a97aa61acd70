package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"time"

	"github.com/flamenet/relay/internal/fdlimit"
	"github.com/flamenet/relay/loadtest/internal/check"
	"github.com/flamenet/relay/loadtest/internal/meter"
	"github.com/flamenet/relay/loadtest/internal/stack"
	"github.com/flamenet/relay/loadtest/report"
)

// load runs one scenario end to end: the stack (unless -url), the run, the
// checks, the report.
func load(ctx context.Context, cfg *config, stdout, stderr io.Writer) (err error) {
	logger := slog.New(slog.NewTextHandler(stderr, nil)).With("component", "loadtest")
	if err := cfg.checkTargets(ctx); err != nil {
		return err
	}
	raiseFileLimit(cfg, logger)
	src := cfg.src
	if src == "" {
		src, err = stack.FindModuleRoot(ctx, ".")
		if err != nil && len(cfg.urls) == 0 && cfg.relayBin == "" {
			return err
		}
	}
	rep := newReport(ctx, cfg, src)

	rg, err := setUp(ctx, cfg, src, rep, logger)
	defer func() {
		if terr := rg.tearDown(ctx); terr != nil {
			err = errors.Join(err, terr)
		}
	}()
	if err != nil {
		return err
	}
	p, err := wire(cfg, rg, rep, logger)
	if err != nil {
		return err
	}
	res, err := p.run(ctx)
	if err != nil {
		return err
	}
	return conclude(cfg, rg, res, rep, stdout, logger)
}

// conclude stops the relays, judges the run, prints its summary line and
// writes its report. It returns errChecksFailed if a check failed.
func conclude(cfg *config, rg *rig, res *check.Result, rep *report.Report, stdout io.Writer, logger *slog.Logger) error {
	if rg.st != nil {
		// Stopped before the report so that an unclean shutdown counts.
		stopErr := rg.st.StopRelays()
		res.Exits = rg.st.UnexpectedExits()
		if stopErr != nil && len(res.Exits) == 0 {
			res.Errors["relay shutdown"]++
		}
		if cfg.relayMemory > 0 {
			res.Memory = rg.st.Memory(cfg.relayMemory, rg.applied)
		}
	}
	res.Fill(rep)
	if rg.fo != nil {
		rep.Failover = rg.fo.Summary(res)
		if e := rep.Failover.Error; e != "" {
			rep.Failures = append(rep.Failures, "the failover did not complete: "+e)
			rep.OK = false
		}
	}
	rep.Date = time.Now().UTC().Truncate(time.Second)
	rep.LoadTester = meter.SelfUsage()

	fmt.Fprintln(stdout, rep.Line())
	for _, l := range rep.WakeLines() {
		fmt.Fprintln(stdout, l)
	}
	for _, f := range rep.Failures {
		logger.Error("check failed", "failure", f)
	}
	if c := rep.Campaign; c != nil && !rep.OK {
		logger.Error("replay this campaign", "seed", c.Seed, "command", c.Replay)
	}
	if cfg.out != "" {
		if err := report.Write(cfg.out, rep); err != nil {
			return err
		}
	}
	if !rep.OK {
		return errChecksFailed
	}
	return nil
}

// raiseFileLimit raises the open-file limit to what the run needs, and
// warns when it cannot.
func raiseFileLimit(cfg *config, logger *slog.Logger) {
	need := fileNeed(cfg)
	soft, _, limErr := fdlimit.RaiseTo(need)
	if limErr != nil {
		logger.Warn("cannot raise the open-file limit", "err", limErr)
	}
	// One connection per held poll, plus sends in flight and slack.
	if soft < need {
		logger.Warn("open-file limit is below what this run needs", "limit", soft, "need", need)
	}
}

// fileNeed returns how many descriptors the tester needs: a connection per held
// poll, sends in flight, the hostile connections (a burst opens several),
// and slack. The relays it starts inherit its limit and need about as
// many: with several replicas each held poll can hold a Redis connection
// besides its socket.
func fileNeed(cfg *config) uint64 {
	slow := slowReadersOf(cfg)
	tester := cfg.pairs + 1024 + 5*cfg.hostile + slow + 64
	relay := 0
	if len(cfg.urls) == 0 {
		perRelay := (cfg.pairs + cfg.replicas - 1) / cfg.replicas
		relay = 2*perRelay + 5*cfg.hostile + slow + 4096
	}
	return uint64(max(tester, relay))
}

// newReport returns the report of cfg's run, as far as it is known before the
// run: what was asked for, and where it runs.
func newReport(ctx context.Context, cfg *config, src string) *report.Report {
	rep := &report.Report{
		Name:     cfg.name,
		Command:  cfg.command,
		Git:      meter.GitState(ctx, src),
		Go:       runtime.Version(),
		Machine:  meter.Machine(),
		Store:    cfg.store,
		Replicas: cfg.replicas,
		Config: report.Config{
			Target:           "throwaway",
			Pairs:            cfg.pairs,
			Rate:             cfg.rate,
			DurationSeconds:  cfg.duration.Seconds(),
			WaitSeconds:      cfg.wait,
			PayloadBytes:     cfg.payload,
			Codec:            cfg.codec,
			Herd:             cfg.herd,
			DrainSeconds:     cfg.drain.Seconds(),
			AckMode:          cfg.ackMode,
			Transport:        transportOf(cfg),
			Hop:              cfg.hop,
			Hostile:          cfg.hostile,
			SlowReaders:      slowReadersOf(cfg),
			HostileKinds:     hostileKindsOf(cfg),
			Renewers:         cfg.renewers,
			RelayMemoryBytes: cfg.relayMemory,
			RelayEnv:         cfg.relayEnv,
		},
	}
	for _, at := range cfg.crashes {
		rep.Config.CrashAtSeconds = append(rep.Config.CrashAtSeconds, at.Seconds())
	}
	rep.Config.Failover = cfg.failover
	if cfg.faults != nil {
		rep.Config.Faults = strconv.FormatUint(*cfg.faults, 10)
		rep.Config.FaultKinds = cfg.faultKinds
		rep.Config.FaultGapSeconds = cfg.faultGap.Seconds()
	}
	if len(cfg.crashes) > 0 {
		rep.Config.CrashDownSeconds = cfg.crashDown.Seconds()
		rep.Config.CrashReplica = "all"
		if cfg.crashReplica >= 0 {
			rep.Config.CrashReplica = strconv.Itoa(cfg.crashReplica)
		}
	}
	return rep
}

// hostileKindsOf returns the report's word for the kinds: none unless some
// were left out.
func hostileKindsOf(cfg *config) string {
	if cfg.hostile == 0 || cfg.hostileKinds == "all" {
		return ""
	}
	return cfg.hostileKinds
}

// transportOf returns how recipients listened, for the report: "stream",
// or nothing for polls.
func transportOf(cfg *config) string {
	if cfg.stream {
		return "stream"
	}
	return ""
}

// slowReadersOf returns how many slow readers a round opens: none without
// hostile connections.
func slowReadersOf(cfg *config) int {
	if cfg.hostile == 0 {
		return 0
	}
	return cfg.slowReaders
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
