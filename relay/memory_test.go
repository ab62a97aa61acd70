package relay

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"runtime"
	"testing"
)

// BenchmarkHeldPollMemory reports what one held poll costs in memory: the
// goroutine stacks and heap in use per poll, with 2,000 held at once. The
// client's side (the test's HTTP client in the same process) is included,
// so compare runs with each other, not with the relay's RSS; the load
// tester's idle populations measure that. Run:
//
//	go test -run '^$' -bench HeldPollMemory -benchtime 1x ./relay/
func BenchmarkHeldPollMemory(b *testing.B) {
	for range b.N {
		stack, heap := heldPollMemory(b, 2000)
		b.ReportMetric(float64(stack), "stack-B/poll")
		b.ReportMetric(float64(heap), "heap-B/poll")
	}
}

func heldPollMemory(tb testing.TB, n int) (stack, heap uint64) {
	return heldMemory(tb, n, func(ctx context.Context, h *harness, tok string) {
		_, _ = h.do(ctx, "GET", "/v1/poll?wait=60", tok, nil)
	}, func(h *harness) {
		eventually(tb, "every poll held", func() bool { return h.srv.HeldPolls() == int64(n) })
		// Held counts a poll from before its first read (its device's
		// registration, queued on SQLite's one writer): what is measured
		// is every poll waiting, each parked.
		eventually(tb, "every poll parked", func() bool { return h.srv.parking != nil && h.srv.parking.Parked.Load() == int64(n) })
	})
}

// heldMemory is what n devices cost in stack and heap, each held by hold
// (which returns when ctx ends), once wait says that all of them are.
func heldMemory(tb testing.TB, n int, hold func(ctx context.Context, h *harness, tok string), wait func(h *harness)) (stack, heap uint64) {
	h := newHarness(tb, nil)
	toks := make([]string, n)
	for i := range n {
		toks[i] = h.token(fmt.Sprint("h", i), "d")
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, n)
	for i := range n {
		go func() {
			hold(ctx, h, toks[i])
			done <- struct{}{}
		}()
	}
	wait(h)
	runtime.GC()
	runtime.GC() // the second cycle shrinks stacks the first found oversized
	runtime.ReadMemStats(&after)
	cancel()
	for range n {
		<-done
	}
	return (after.StackInuse - before.StackInuse) / uint64(n), (after.HeapInuse - before.HeapInuse) / uint64(n)
}

// BenchmarkHeldStreamMemory is BenchmarkHeldPollMemory for idle streams,
// each read by the test's client up to its "ready" event. Run both in one
// command to compare them:
//
//	go test -run '^$' -bench 'Held(Poll|Stream)Memory' -benchtime 1x ./relay/
func BenchmarkHeldStreamMemory(b *testing.B) {
	for range b.N {
		stack, heap := heldStreamMemory(b, 2000)
		b.ReportMetric(float64(stack), "stack-B/stream")
		b.ReportMetric(float64(heap), "heap-B/stream")
	}
}

func heldStreamMemory(tb testing.TB, n int) (stack, heap uint64) {
	ready := make(chan error, n)
	return heldMemory(tb, n, func(ctx context.Context, h *harness, tok string) {
		req, err := http.NewRequestWithContext(ctx, "GET", h.url+"/v1/stream", nil)
		if err != nil {
			ready <- err
			return
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := h.client.Do(req)
		if err != nil {
			ready <- err
			return
		}
		defer resp.Body.Close()
		// Small buffers: the client's side is measured too, and a poll's
		// client holds none.
		rd := bufio.NewReaderSize(resp.Body, 128)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				ready <- err
				return
			}
			if line == "event: ready\n" {
				break
			}
		}
		ready <- nil
		var b [128]byte
		for err == nil {
			_, err = rd.Read(b[:])
		}
	}, func(*harness) {
		for range n {
			if err := <-ready; err != nil {
				tb.Fatal(err)
			}
		}
	})
}
