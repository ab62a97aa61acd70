package service

import (
	"slices"
	"testing"
)

type recorder struct {
	name string
	log  *[]string
}

func (r recorder) Start() { *r.log = append(*r.log, "start "+r.name) }
func (r recorder) Stop()  { *r.log = append(*r.log, "stop "+r.name) }

// TestGroupOrder: services start in the order given and stop in the
// reverse, once each, and nothing starts after Stop.
func TestGroupOrder(t *testing.T) {
	var log []string
	var g Group
	g.Start(recorder{"memory", &log}, recorder{"fleet", &log})
	g.Start(recorder{"expiry", &log})
	g.Stop()
	g.Stop()
	g.Start(recorder{"late", &log})
	want := []string{"start memory", "start fleet", "start expiry", "stop expiry", "stop fleet", "stop memory"}
	if !slices.Equal(log, want) {
		t.Fatalf("log = %q, want %q", log, want)
	}
}
