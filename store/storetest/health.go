package storetest

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
)

// testReportHealth: relays sharing a store see each other's latest report,
// their own included, and not reports older than asked for.
func testReportHealth(t *testing.T, open Opener) {
	s := fresh(t, open)
	report := func(id string, ok bool, at, since time.Time) []store.RelayHealth {
		t.Helper()
		got, err := s.ReportHealth(ctx(t), store.RelayHealth{ID: id, WakesOK: ok, At: at}, since)
		if err != nil {
			t.Fatalf("ReportHealth(%s): %v", id, err)
		}
		slices.SortFunc(got, func(a, b store.RelayHealth) int { return strings.Compare(a.ID, b.ID) })
		return got
	}
	same := func(got, want []store.RelayHealth) bool {
		return slices.EqualFunc(got, want, func(a, b store.RelayHealth) bool {
			return a.ID == b.ID && a.WakesOK == b.WakesOK && a.At.Equal(b.At)
		})
	}
	old := report("a", true, t0, t0)
	if !same(old, []store.RelayHealth{{ID: "a", WakesOK: true, At: t0}}) {
		t.Fatalf("first report = %+v", old)
	}
	t1 := t0.Add(time.Second)
	got := report("b", false, t1, t0)
	want := []store.RelayHealth{{ID: "a", WakesOK: true, At: t0}, {ID: "b", WakesOK: false, At: t1}}
	if !same(got, want) {
		t.Fatalf("b's report = %+v, want %+v", got, want)
	}
	// a reports again; b's report is too old for what a asks.
	t3 := t0.Add(3 * time.Second)
	got = report("a", false, t3, t0.Add(2*time.Second))
	if want := []store.RelayHealth{{ID: "a", WakesOK: false, At: t3}}; !same(got, want) {
		t.Fatalf("a's second report = %+v, want %+v", got, want)
	}
}
