package sqlite

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/store/storetest"
)

func benchDB(b *testing.B, devices ...string) *DB {
	b.Helper()
	db := openTB(b, tempPath(b))
	b.Cleanup(func() { db.Close() })
	for _, d := range devices {
		if _, err := db.Register(context.Background(), store.RegisterParams{Household: "h", Device: d, Now: t0}); err != nil {
			b.Fatal(err)
		}
	}
	return db
}

// BenchmarkSend: 1 KiB to one recipient, synchronous=FULL, senders in
// parallel queueing on the one writer.
func BenchmarkSend(b *testing.B) {
	for _, fan := range []int{1, 8} {
		b.Run("recipients="+strconv.Itoa(fan), func(b *testing.B) {
			var to []string
			for i := range fan {
				to = append(to, "d"+strconv.Itoa(i))
			}
			db := benchDB(b, to...)
			payload := make([]byte, 1024)
			var n atomic.Int64
			b.SetBytes(int64(len(payload) * fan))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := strconv.FormatInt(n.Add(1), 10)
					if _, err := db.Send(context.Background(), store.SendParams{Household: "h", Sender: "s", ID: id, To: to, Payload: payload, Now: t0}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkFetch: one poll's read of 100 envelopes of 4 KiB from a queue of
// 1000.
func BenchmarkFetch(b *testing.B) {
	db := benchDB(b, "d")
	payload := make([]byte, 4096)
	for i := range 1000 {
		if _, err := db.Send(context.Background(), store.SendParams{Household: "h", Sender: "s", ID: strconv.Itoa(i), To: []string{"d"}, Payload: payload, Now: t0}); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(100 * int64(len(payload)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bt, err := db.Fetch(context.Background(), store.FetchParams{Household: "h", Device: "d", Limit: 100, Budget: 2 << 20})
			if err != nil || len(bt.Envelopes) != 100 {
				b.Errorf("Fetch = %d envelopes, %v", len(bt.Envelopes), err)
				return
			}
		}
	})
}

// BenchmarkSendDuringExpiry: send latency with and without expiry deleting
// old envelopes beside it (go test -bench SendDuringExpiry -benchtime 500x).
func BenchmarkSendDuringExpiry(b *testing.B) {
	storetest.BenchSendDuringExpiry(b, benchDB(b))
}

// BenchmarkSendConcurrent: many senders at once (32 goroutines on two
// cores), 1 KiB to one of 64 recipients each, synchronous=FULL: what group
// commit is for. ns/op is per send across all senders; p50-ms is the
// median latency of one send.
func BenchmarkSendConcurrent(b *testing.B) {
	devices := make([]string, 64)
	for i := range devices {
		devices[i] = "d" + strconv.Itoa(i)
	}
	db := benchDB(b, devices...)
	payload := make([]byte, 1024)
	var (
		n   atomic.Int64
		mu  sync.Mutex
		lat []time.Duration
	)
	b.SetBytes(int64(len(payload)))
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			i := n.Add(1)
			to := []string{devices[i%int64(len(devices))]}
			start := time.Now()
			if _, err := db.Send(context.Background(), store.SendParams{Household: "h", Sender: "s", ID: strconv.FormatInt(i, 10), To: to, Payload: payload, Now: t0}); err != nil {
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
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	}
}
