package storetest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
)

// BenchSendDuringExpiry measures sends to a device while expiry deletes old
// envelopes of other devices, beside the same sends with no expiry running,
// and reports each run's send latency percentiles. s must be empty.
//
// Expiry works in small batches, each its own transaction, so that a send
// never waits behind it for long; this is the measurement of that.
func BenchSendDuringExpiry(b *testing.B, s store.Store) {
	ctx := context.Background()
	now := time.Now()
	old := now.Add(-48 * time.Hour)
	devices := make([]string, 64)
	for i := range devices {
		devices[i] = fmt.Sprintf("old%02d", i)
	}
	for _, d := range append(slices.Clone(devices), "fresh") {
		if _, err := s.Register(ctx, store.RegisterParams{Household: hh, Device: d, Now: old}); err != nil {
			b.Fatal(err)
		}
	}
	payload := make([]byte, 512)
	var id int
	send := func(to []string, at time.Time) time.Duration {
		id++
		start := time.Now()
		if _, err := s.Send(ctx, store.SendParams{Household: hh, Sender: "bench", ID: strconv.Itoa(id), To: to, Payload: payload, Now: at}); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	measure := func(b *testing.B) []time.Duration {
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			lat = append(lat, send([]string{"fresh"}, time.Now()))
		}
		b.StopTimer()
		// Keep the fresh device's queue from growing into the pending limits.
		pos, err := s.Ack(ctx, store.AckParams{Household: hh, Device: "fresh", Cursor: -1, Now: time.Now()})
		if err == nil {
			_, err = s.Ack(ctx, store.AckParams{Household: hh, Device: "fresh", Cursor: pos.Head, Now: time.Now()})
		}
		if err != nil {
			b.Fatal(err)
		}
		return lat
	}

	b.Run("idle", func(b *testing.B) {
		report(b, measure(b))
	})
	b.Run("expiring", func(b *testing.B) {
		b.StopTimer()
		// 20 old envelopes per timed send, fanned out to 64 devices.
		for range max(1, b.N*20/len(devices)) {
			send(devices, old)
		}
		done := make(chan store.ExpireResult, 1)
		go func() {
			res, err := s.Expire(ctx, store.ExpireParams{EnvelopesBefore: now.Add(-24 * time.Hour), SendsBefore: old.Add(-time.Hour), Batch: 500})
			if err != nil {
				b.Error(err)
			}
			done <- res
		}()
		lat := measure(b)
		res := <-done
		b.ReportMetric(float64(res.Envelopes), "expired")
		report(b, lat)
	})
}

func report(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(q float64) float64 {
		return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(at(0.5), "p50-ms")
	b.ReportMetric(at(0.99), "p99-ms")
	b.ReportMetric(at(1), "max-ms")
}
