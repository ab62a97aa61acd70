// Package schedule is when a run's sends are due: a fixed open-loop plan
// at the offered rate, and the loop that fires each send on time however
// slowly the relay answers the ones before.
package schedule

import (
	"context"
	"math"
	"sync"
	"time"
)

// Schedule is a fixed open-loop plan: send i at Start + i/rate.
type Schedule struct {
	Start time.Time
	rate  float64
	N     int // how many sends
}

// New returns the plan of the sends of d at rate from start.
func New(start time.Time, rate float64, d time.Duration) Schedule {
	// The epsilon keeps 3s x 20/s at 60 sends, not 59, despite float error.
	n := int(math.Floor(d.Seconds()*rate + 1e-9))
	return Schedule{Start: start, rate: rate, N: n}
}

// At returns when send i is due.
func (s Schedule) At(i int) time.Time {
	return s.Start.Add(time.Duration(float64(i) * float64(time.Second) / s.rate))
}

// OpenLoop calls fire(i, at) in a goroutine of its own at each scheduled
// time and returns when every fire has returned. It never waits for one
// fire before starting the next, so a slow relay cannot lower the offered
// load. limit bounds the fires in flight only to keep the tester alive; a
// fire held back by it starts late and the caller counts it so. After ctx
// ends no new fire starts.
func OpenLoop(ctx context.Context, s Schedule, limit int, fire func(i int, at time.Time)) {
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	for i := range s.N {
		at := s.At(i)
		if d := time.Until(at); d > 0 {
			t.Reset(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fire(i, at)
		}()
	}
}
