package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flamenet/relay/loadtest/report"
)

// sample is the tester's held polls and the relays' resident memory at
// one moment.
type sample struct {
	at   time.Time
	held int
	rss  int64
}

// sampleLoop samples every second from start to end.
func (r *runner) sampleLoop(ctx context.Context, start, end time.Time) {
	if !sleepUntil(ctx, start) {
		return
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		rss, err := r.meter.rss(ctx)
		if err == nil {
			r.mu.Lock()
			r.samples = append(r.samples, sample{at: time.Now(), held: int(r.held.Load()), rss: rss})
			r.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if now.After(end) {
				return
			}
		}
	}
}

// steadyState is the medians of the samples taken in the second half of
// the offered window [start, end]: by then every poll of the run has been
// held for a while, and start-up is long past.
func steadyState(samples []sample, start, end time.Time) *report.Steady {
	from := start.Add(end.Sub(start) / 2)
	var held []int
	var rss []int64
	for _, s := range samples {
		if !s.at.Before(from) && !s.at.After(end) {
			held = append(held, s.held)
			rss = append(rss, s.rss)
		}
	}
	if len(held) == 0 {
		return nil
	}
	return &report.Steady{
		FromSeconds: round3(from.Sub(start).Seconds()),
		ToSeconds:   round3(end.Sub(start).Seconds()),
		Samples:     len(held),
		HeldPolls:   median(held),
		RSSBytes:    median(rss),
	}
}

// median is the lower median of v; it sorts v.
func median[T int | int64](v []T) T {
	slices.Sort(v)
	return v[(len(v)-1)/2]
}

// redisSampler samples Redis's connected_clients while replicas run.
type redisSampler struct {
	client *goredis.Client
	before int

	mu      sync.Mutex
	samples []int
}

// newRedisSampler connects to Redis and takes the baseline sample.
func newRedisSampler(ctx context.Context, rawURL string) (*redisSampler, error) {
	opt, err := goredis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	opt.PoolSize = 1
	s := &redisSampler{client: goredis.NewClient(opt)}
	if s.before, err = s.clients(ctx); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *redisSampler) clients(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := s.client.Info(ctx, "clients").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO clients: %w", err)
	}
	return parseConnectedClients(info)
}

func parseConnectedClients(info string) (int, error) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("redis INFO clients has no connected_clients")
}

func (s *redisSampler) sampleLoop(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if n, err := s.clients(ctx); err == nil {
				s.mu.Lock()
				s.samples = append(s.samples, n)
				s.mu.Unlock()
			}
		}
	}
}

func (s *redisSampler) summary() *report.Redis {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &report.Redis{ClientsBefore: s.before, Samples: len(s.samples)}
	if len(s.samples) > 0 {
		v := slices.Clone(s.samples)
		out.ClientsMedian = median(v)
		out.ClientsPeak = slices.Max(v)
	}
	return out
}

func (s *redisSampler) close() { _ = s.client.Close() }
