package postgres

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/store/storetest"
)

// BenchmarkSend measures one send end to end: a single recipient, a
// fan-out to eight, and many senders at once to distinct recipients (which
// must not wait on each other's row locks). p50-us is the median latency
// of one send, steadier than the mean when commits' WAL flushes stall now
// and then.
func BenchmarkSend(b *testing.B) {
	payload := make([]byte, 1024)
	for _, fanout := range []int{1, 8} {
		b.Run(fmt.Sprintf("to=%d", fanout), func(b *testing.B) {
			db := openDB(b, 4)
			to := make([]string, fanout)
			for i := range to {
				to[i] = fmt.Sprintf("d%02d", i)
			}
			register(b, db, "home", to...)
			ctx := testCtx(b)
			lat := make([]time.Duration, 0, b.N)
			b.SetBytes(int64(len(payload) * fanout))
			b.ResetTimer()
			for i := range b.N {
				start := time.Now()
				_, err := db.Send(ctx, store.SendParams{Household: "home", Sender: "s", ID: strconv.Itoa(i), To: to, Payload: payload, Now: t0})
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			reportMedian(b, lat)
		})
	}
	b.Run("parallel,to=1", func(b *testing.B) {
		db := openDB(b, 8)
		const devices = 64
		for i := range devices {
			register(b, db, "home", fmt.Sprintf("d%02d", i))
		}
		ctx := testCtx(b)
		var (
			next atomic.Int64
			mu   sync.Mutex
			lat  []time.Duration
		)
		b.SetBytes(int64(len(payload)))
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			var mine []time.Duration
			for pb.Next() {
				i := next.Add(1)
				to := []string{fmt.Sprintf("d%02d", i%devices)}
				start := time.Now()
				if _, err := db.Send(ctx, store.SendParams{Household: "home", Sender: "s", ID: strconv.FormatInt(i, 10), To: to, Payload: payload, Now: t0}); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
		b.StopTimer()
		reportMedian(b, lat)
	})
}

// reportMedian reports the median of lat in microseconds.
func reportMedian(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1000, "p50-us")
}

// BenchmarkFetch measures a poll's reads: a full page of 100 envelopes of
// 1 KiB, and the common case of nothing waiting.
func BenchmarkFetch(b *testing.B) {
	db := openDB(b, 4)
	register(b, db, "home", "full", "empty")
	ctx := testCtx(b)
	payload := make([]byte, 1024)
	for i := range 1000 {
		if _, err := db.Send(ctx, store.SendParams{Household: "home", Sender: "s", ID: strconv.Itoa(i), To: []string{"full"}, Payload: payload, Now: t0}); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := db.pool.Exec(ctx, "VACUUM ANALYZE envelopes"); err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name   string
		device string
		want   int
	}{
		{"100x1KiB", "full", 100},
		{"empty", "empty", 0},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(c.want * len(payload)))
			for range b.N {
				batch, err := db.Fetch(ctx, store.FetchParams{Household: "home", Device: c.device, Limit: 100, Budget: 2 << 20})
				if err != nil {
					b.Fatal(err)
				}
				if len(batch.Envelopes) != c.want {
					b.Fatalf("fetched %d envelopes, want %d", len(batch.Envelopes), c.want)
				}
			}
		})
	}
}

// BenchmarkSendDuringExpiry: send latency with and without expiry deleting
// old envelopes beside it (go test -bench SendDuringExpiry -benchtime 500x).
func BenchmarkSendDuringExpiry(b *testing.B) {
	storetest.BenchSendDuringExpiry(b, openDB(b, 4))
}
