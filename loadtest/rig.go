package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/flamenet/relay/loadtest/internal/faults"
	"github.com/flamenet/relay/loadtest/internal/meter"
	"github.com/flamenet/relay/loadtest/internal/stack"
	"github.com/flamenet/relay/loadtest/report"
)

// rig is what a run's load is offered to: the relays (a throwaway stack,
// or the -url targets), the servers and the formation its faults need,
// and the meters that read them.
type rig struct {
	key  ed25519.PrivateKey // the issuer the relays trust
	urls []string           // the relays' base URLs
	// st is the throwaway stack; nil against -url.
	st *stack.Stack
	// svc are a fault campaign's own Postgres and Redis; nil without one.
	svc *stack.Services
	// fo is the -failover formation; nil without one.
	fo *faults.Failover
	// meter reads the relays' cost; nil when nothing can.
	meter meter.Meter
	// redis samples the clients of the relays' Redis; nil unless the
	// stack has replicas on a Redis the tester did not start.
	redis *meter.Redis
	// applied is the memory limit read back from the kernel.
	applied int64
	// buildDir holds the relay the tester built.
	buildDir string
}

// setUp builds and starts what cfg's run needs, and notes in rep what it
// learns of the relays. The rig it returns holds whatever started, even
// on error, for tearDown.
func setUp(ctx context.Context, cfg *config, src string, rep *report.Report, logger *slog.Logger) (rg *rig, err error) {
	rg = &rig{}
	if cfg.faults != nil {
		// Before the stack, and torn down after it: the stack's database
		// is dropped on this Postgres.
		logger.Info("starting the campaign's own Postgres and Redis")
		rg.svc, err = stack.StartServices(ctx)
		if err != nil {
			return rg, fmt.Errorf("fault campaign: %w", err)
		}
		logger.Info("campaign services ready", "postgres", rg.svc.PGURL, "redis", rg.svc.RedisURL, "postgres_dir", rg.svc.PG.Dir())
	}
	if cfg.failover != "" {
		// Before the stack, and torn down after it, as the campaign's.
		if rg.fo, err = faults.StartFailover(ctx, cfg.failover, cfg.failoverAt, logger); err != nil {
			return rg, err
		}
	}
	if len(cfg.urls) == 0 {
		if err := rg.boot(ctx, cfg, src, rep, logger); err != nil {
			return rg, err
		}
	} else {
		rep.Config.Target = strings.Join(cfg.urls, ",")
		rg.key, _ = issuerKey(cfg.issuerSeed) // validated with the config
		rg.urls = cfg.urls
	}
	if len(cfg.metricsURLs) > 0 {
		// No keep-alive: a scrape a second needs no pool, and none is left
		// behind when the run ends.
		rg.meter = meter.NewMetrics(cfg.metricsURLs, &http.Client{
			Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true},
		})
	}
	return rg, nil
}

// boot builds the relay (unless -relay-bin) and boots the throwaway stack
// on the store cfg names.
func (rg *rig) boot(ctx context.Context, cfg *config, src string, rep *report.Report, logger *slog.Logger) error {
	bin := cfg.relayBin
	if bin == "" {
		dir, err := os.MkdirTemp("", "relay-build-")
		if err != nil {
			return fmt.Errorf("build dir: %w", err)
		}
		rg.buildDir = dir
		logger.Info("building relay", "src", src)
		if bin, err = stack.BuildRelay(ctx, src, dir); err != nil {
			return err
		}
	}
	pg, redisURL := cfg.pg, cfg.redis
	if rg.svc != nil {
		pg, redisURL = rg.svc.PGURL, rg.svc.RedisURL
	} else if rg.fo != nil {
		pg = rg.fo.URL()
	} else if cfg.replicas > 1 {
		// Sampled before the relays start: the server's other clients
		// are the baseline.
		var err error
		if rg.redis, err = meter.NewRedis(ctx, cfg.redis); err != nil {
			logger.Warn("redis connected_clients will not be sampled", "err", err)
		}
	}
	st, err := stack.Boot(ctx, stack.Params{
		Bin: bin, Store: cfg.store, PG: pg, Replicas: cfg.replicas, Redis: redisURL, Wait: cfg.wait,
		Env: cfg.relayEnv, Memory: cfg.relayMemory,
		// A herd waits for the relays to say they hold every poll, and
		// several relays say what their Redis wake-ups cost them.
		Metrics: cfg.herd || cfg.replicas > 1,
	}, logger)
	if err != nil {
		return err
	}
	rg.st = st
	rg.key, rg.urls = st.Key(), st.URLs()
	for i := range st.Replicas() {
		if l, err := meter.OpenFileLimit(st.Relay(i).Pid()); err == nil {
			if rep.Machine.RelayOpenFile == 0 || l < rep.Machine.RelayOpenFile {
				rep.Machine.RelayOpenFile = l
			}
		}
	}
	if cfg.relayMemory > 0 {
		if rg.applied, err = st.AppliedLimit(); err != nil {
			logger.Warn("cannot read back the relay's memory limit", "err", err)
		} else {
			logger.Info("relay memory capped", "limit", cfg.relayMemory, "applied", rg.applied)
		}
	}
	var git *report.Git
	if cfg.relayCommit != "" {
		git = &report.Git{Commit: cfg.relayCommit}
	}
	rg.meter = meter.NewProc(st, git)
	return nil
}

// tearDown stops and removes whatever setUp started, the stack before
// the servers its database lives on, and joins what went wrong.
func (rg *rig) tearDown(ctx context.Context) error {
	var errs []error
	if rg.redis != nil {
		rg.redis.Close()
	}
	if rg.st != nil {
		// Whatever happened, the stack goes: relays get SIGTERM, the
		// memory cgroups and the throwaway database are removed, the
		// temp dir too.
		if err := rg.st.Close(context.WithoutCancel(ctx)); err != nil {
			errs = append(errs, fmt.Errorf("tear down: %w", err))
		}
	}
	if rg.buildDir != "" {
		os.RemoveAll(rg.buildDir)
	}
	if rg.fo != nil {
		if err := rg.fo.Close(); err != nil {
			errs = append(errs, fmt.Errorf("tear down the formation: %w", err))
		}
	}
	if rg.svc != nil {
		if err := rg.svc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("tear down the campaign's services: %w", err))
		}
	}
	return errors.Join(errs...)
}

// sourceAddrs decides how many loopback source addresses the pairs'
// connections are spread over. Every connection to one relay needs an
// ephemeral port of its own per source address; a run that would use more
// than half the range gets more addresses, so that it never runs short
// while connections in TIME_WAIT hold some.
func sourceAddrs(cfg *config, urls []string, rep *report.Report, logger *slog.Logger) int {
	lo, hi, err := meter.EphemeralPorts()
	if err == nil {
		rep.Machine.EphemeralPorts = fmt.Sprintf("%d-%d", lo, hi)
	}
	loopback4 := true
	for _, u := range urls {
		pu, perr := url.Parse(u)
		ip := net.ParseIP(pu.Hostname())
		if perr != nil || ip == nil || ip.To4() == nil || !ip.IsLoopback() {
			loopback4 = false
		}
	}
	n := cfg.sourceAddrs
	if n == 0 && err == nil {
		perRelay := (cfg.pairs+len(urls)-1)/len(urls) + 1024
		half := max((hi-lo+1)/2, 1)
		n = (perRelay + half - 1) / half
	}
	if n > 1 && !loopback4 {
		logger.Warn("connections come from one source address: the targets are not IPv4 loopback addresses", "wanted", n)
		return 1
	}
	if n > 1 {
		logger.Info("spreading connections over loopback source addresses", "addresses", n, "ephemeral_ports", rep.Machine.EphemeralPorts)
	}
	return max(n, 1)
}
