package meter

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flamenet/relay/loadtest/internal/wait"
	"github.com/flamenet/relay/loadtest/report"
)

// sample is the tester's held polls and the relays' resident memory at
// one moment.
type sample struct {
	at   time.Time
	held int
	rss  int64
}

// Samples are the tester's held polls and the relays' resident memory,
// taken every second while the sends run, for the steady state.
type Samples struct {
	meter Meter
	held  func() int

	mu      sync.Mutex
	samples []sample
}

// NewSamples returns the samples of m's resident memory and of held, the
// polls the tester holds.
func NewSamples(m Meter, held func() int) *Samples {
	return &Samples{meter: m, held: held}
}

// Loop samples every second from start to end.
func (s *Samples) Loop(ctx context.Context, start, end time.Time) {
	if !wait.Until(ctx, start) {
		return
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		rss, err := s.meter.RSS(ctx)
		if err == nil {
			s.mu.Lock()
			s.samples = append(s.samples, sample{at: time.Now(), held: s.held(), rss: rss})
			s.mu.Unlock()
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

// Steady returns the steady state of the sends offered over [start, end];
// nil without a sample in its second half.
func (s *Samples) Steady(start, end time.Time) *report.Steady {
	s.mu.Lock()
	defer s.mu.Unlock()
	return steadyState(s.samples, start, end)
}

// steadyState returns the medians of the samples taken in the second half of
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

// median returns the lower median of v; it sorts v.
func median[T int | int64](v []T) T {
	slices.Sort(v)
	return v[(len(v)-1)/2]
}

// Redis samples Redis's connected_clients while replicas run.
type Redis struct {
	client *goredis.Client
	before int

	mu      sync.Mutex
	samples []int
}

// NewRedis connects to Redis and takes the baseline sample.
func NewRedis(ctx context.Context, rawURL string) (*Redis, error) {
	opt, err := goredis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	opt.PoolSize = 1
	s := &Redis{client: goredis.NewClient(opt)}
	if s.before, err = s.clients(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Redis) clients(ctx context.Context) (int, error) {
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

// Loop samples every second until ctx ends.
func (s *Redis) Loop(ctx context.Context) {
	everySecond(ctx, func() {
		if n, err := s.clients(ctx); err == nil {
			s.mu.Lock()
			s.samples = append(s.samples, n)
			s.mu.Unlock()
		}
	})
}

// Summary returns the report's account of the samples.
func (s *Redis) Summary() *report.Redis {
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

// Close closes the connection to Redis.
func (s *Redis) Close() { _ = s.client.Close() }
