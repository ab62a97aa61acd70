package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flamenet/relay/internal/servicetest"
)

func TestStatGroup(t *testing.T) {
	for _, tc := range []struct {
		stat  string
		state string
		pgrp  int
		ok    bool
	}{
		{"123 (postgres) S 1 120 120 0 -1", "S", 120, true},
		{"124 (a) b) Z 123 120 120 0", "Z", 120, true},
		{"125 (x)", "", 0, false},
	} {
		state, pgrp, ok := statGroup(tc.stat)
		if state != tc.state || pgrp != tc.pgrp || ok != tc.ok {
			t.Errorf("statGroup(%q) = %q %d %v, want %q %d %v", tc.stat, state, pgrp, ok, tc.state, tc.pgrp, tc.ok)
		}
	}
}

// needServices skips without what a campaign starts, or fails under
// FN_TEST_REQUIRE_SERVICES=1.
func needServices(t *testing.T) {
	t.Helper()
	if err := servicesMissing(); err != nil {
		servicetest.Unavailable(t, "initdb, postgres and redis-server (a fault campaign's own servers)", err)
	}
}

// TestCampaignServices starts the campaign's own Postgres and Redis, kills
// and restarts Postgres (every process of it, as a crash would), pauses
// Redis, and tears both down with their directories.
func TestCampaignServices(t *testing.T) {
	needServices(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sv, err := startServices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sv.close()
	if strings.Contains(sv.pgURL, ":5432/") || strings.Contains(sv.redisURL, ":6379/") {
		t.Fatalf("campaign services on the machine's ports: %s %s", sv.pgURL, sv.redisURL)
	}
	query := func() error {
		conn, err := pgx.Connect(ctx, sv.pgURL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS t (n int); INSERT INTO t VALUES (1)")
		return err
	}
	if err := query(); err != nil {
		t.Fatal(err)
	}
	// A connection open across the kill: its backend dies with the rest.
	conn, err := pgx.Connect(ctx, sv.pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	pgid, _ := sv.pg.group()
	if err := sv.pg.kill(); err != nil {
		t.Fatal(err)
	}
	if groupAlive(pgid) {
		t.Errorf("Postgres group %d alive after the kill", pgid)
	}
	if err := sv.pg.start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := query(); err != nil {
		t.Errorf("after the restart: %v", err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Errorf("a connection to the killed Postgres still answers")
	}

	if err := sv.redis.pause(); err != nil {
		t.Fatal(err)
	}
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	err = sv.redis.ready(short)
	stop()
	if err == nil {
		t.Errorf("a paused Redis answered PING")
	}
	if err := sv.redis.resume(); err != nil {
		t.Fatal(err)
	}
	if err := sv.redis.ready(ctx); err != nil {
		t.Errorf("resumed Redis: %v", err)
	}

	rpgid, _ := sv.redis.group()
	dirs := []string{sv.pg.dir, sv.redis.dir}
	if err := sv.close(); err != nil {
		t.Fatal(err)
	}
	for _, g := range []int{pgid, rpgid} {
		if err := syscall.Kill(-g, 0); !errors.Is(err, syscall.ESRCH) && groupAlive(g) {
			t.Errorf("group %d still alive after close", g)
		}
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", d, err)
		}
	}
}
