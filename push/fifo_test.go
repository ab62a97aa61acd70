package push

import (
	"math/rand/v2"
	"testing"
)

// fifo against a plain slice, through random pushes and pops that make it
// compact and grow many times.
func TestFIFO(t *testing.T) {
	var f fifo[int]
	var model []int
	r := rand.New(rand.NewPCG(1, 2))
	next, peak := 0, 0
	for i := range 100000 {
		if r.IntN(3) > 0 || len(model) == 0 { // grows on average
			f.push(next)
			model = append(model, next)
			next++
		} else {
			got, want := f.pop(), model[0]
			model = model[1:]
			if got != want {
				t.Fatalf("step %d: pop %d, want %d", i, got, want)
			}
		}
		peak = max(peak, len(model))
		if f.len() != len(model) {
			t.Fatalf("step %d: len %d, want %d", i, f.len(), len(model))
		}
		if i%1000 == 0 {
			j := 0
			f.each(func(v int) {
				if v != model[j] {
					t.Fatalf("step %d: item %d is %d, want %d", i, j, v, model[j])
				}
				j++
			})
		}
		if r.IntN(5000) == 0 {
			f.reset()
			model = nil // the slice keeps its capacity, so peak stays
		}
	}
	if cap(f.items) > 4*peak+64 {
		t.Errorf("cap %d for at most %d items: popped slots are not reused", cap(f.items), peak)
	}
}

// A queue that never empties reuses its popped slots: its slice stays
// small however many items pass through. Without the compaction in push
// (done once on purpose) it grows to hold every item ever pushed.
func TestFIFOSteadyState(t *testing.T) {
	var f fifo[int]
	for i := range 5 {
		f.push(i)
	}
	for i := 5; i < 100000; i++ {
		f.push(i)
		if got := f.pop(); got != i-5 {
			t.Fatalf("pop %d, want %d", got, i-5)
		}
	}
	if c := cap(f.items); c > 64 {
		t.Errorf("cap %d for 5 items", c)
	}
}
