package main

import (
	"context"
	"math"
	"sync"
	"time"
)

// schedule is a fixed open-loop plan: send i at start + i/rate.
type schedule struct {
	start time.Time
	rate  float64
	n     int
}

func newSchedule(start time.Time, rate float64, d time.Duration) schedule {
	// The epsilon keeps 3s x 20/s at 60 sends, not 59, despite float error.
	n := int(math.Floor(d.Seconds()*rate + 1e-9))
	return schedule{start: start, rate: rate, n: n}
}

func (s schedule) at(i int) time.Time {
	return s.start.Add(time.Duration(float64(i) * float64(time.Second) / s.rate))
}

// openLoop calls fire(i, at) in a goroutine of its own at each scheduled
// time and returns when every fire has returned. It never waits for one
// fire before starting the next, so a slow relay cannot lower the offered
// load. limit bounds the fires in flight only to keep the tester alive; a
// fire held back by it starts late and the caller counts it so. After ctx
// ends no new fire starts.
func openLoop(ctx context.Context, s schedule, limit int, fire func(i int, at time.Time)) {
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	for i := range s.n {
		at := s.at(i)
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
