package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	relayconfig "github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/loadtest/internal/faults"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigDefaultsEnvAndFlags(t *testing.T) {
	c, err := parseConfig(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.pairs != 1000 || c.rate != 100 || c.duration != 60*time.Second || c.wait != 20 ||
		c.payload != 256 || c.codec != "json" || c.store != "sqlite" || c.replicas != 1 || c.drain != 30*time.Second {
		t.Errorf("defaults: %+v", c)
	}

	c, err = parseConfig([]string{"-rate", "7"}, env(map[string]string{
		"LOAD_PAIRS": "12", "LOAD_RATE": "50", "LOAD_DURATION": "60", "LOAD_HERD": "true",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.pairs != 12 || c.rate != 7 || c.duration != time.Minute || !c.herd {
		t.Errorf("env and flags: pairs %d rate %v duration %v herd %v", c.pairs, c.rate, c.duration, c.herd)
	}
	if !slices.Contains(c.command, "LOAD_PAIRS=12") || c.command[len(c.command)-1] != "7" {
		t.Errorf("command = %q", c.command)
	}

	if _, err := parseConfig(nil, env(map[string]string{"LOAD_PAIRS": "many"}), io.Discard); err == nil {
		t.Error("LOAD_PAIRS=many accepted")
	}
}

func TestConfigRefusals(t *testing.T) {
	seed := base64.StdEncoding.EncodeToString(make([]byte, ed25519.SeedSize))
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"sqlite replicas", []string{"-replicas", "2"}, "needs -store postgres"},
		{"url without key", []string{"-url", "http://127.0.0.1:1"}, "needs -issuer-key"},
		{"bad key", []string{"-url", "http://127.0.0.1:1", "-issuer-key", "c2hvcnQ="}, "32-byte seed"},
		{"codec", []string{"-codec", "xml"}, "json or msgpack"},
		{"payload", []string{"-payload", "70000"}, "-payload"},
		{"store", []string{"-store", "mysql"}, "sqlite or postgres"},
		{"ack", []string{"-ack", "never"}, "cursor or explicit"},
		{"crash after the window", []string{"-duration", "10s", "-crash", "10s"}, "inside the offered duration"},
		{"crash replica", []string{"-store", "postgres", "-replicas", "2", "-crash", "1s", "-crash-replica", "2"}, "-crash-replica 2"},
		{"crash needs a stack", []string{"-url", "http://127.0.0.1:1", "-issuer-key", seed, "-crash", "1s"}, "-crash needs a throwaway stack"},
		{"memory needs a stack", []string{"-url", "http://127.0.0.1:1", "-issuer-key", seed, "-relay-memory", "1GiB"}, "-relay-memory needs"},
		{"env needs a stack", []string{"-url", "http://127.0.0.1:1", "-issuer-key", seed, "-relay-env", "FN_X=1"}, "-relay-env needs"},
		{"memory too small", []string{"-relay-memory", "1MiB"}, "at least 16MiB"},
		{"memory unreadable", []string{"-relay-memory", "lots"}, "want a size"},
		{"env the stack owns", []string{"-relay-env", "FN_DATABASE_URL=sqlite:x"}, "sets FN_DATABASE_URL itself"},
		{"env not a pair", []string{"-relay-env", "FN_X"}, "want KEY=VALUE"},
		{"hostile", []string{"-hostile", "-1"}, "-hostile"},
		{"hostile kinds", []string{"-hostile", "1", "-hostile-kinds", "tokens"}, "want all or pairing"},
		{"hop above 1", []string{"-store", "postgres", "-replicas", "2", "-hop", "1.5"}, "-hop 1.5: want a chance from 0 to 1"},
		{"hop below 0", []string{"-store", "postgres", "-replicas", "2", "-hop", "-0.1"}, "-hop -0.1: want a chance from 0 to 1"},
		{"hop NaN", []string{"-store", "postgres", "-replicas", "2", "-hop", "NaN"}, "want a chance from 0 to 1"},
		{"hop one relay", []string{"-hop", "0.5"}, "-hop above 0 needs more than one relay"},
		{"hop one url", []string{"-url", "http://127.0.0.1:1", "-issuer-key", seed, "-hop", "0.5"}, "-hop above 0 needs more than one relay"},
		{"hop two urls", []string{"-url", "http://127.0.0.1:1,http://127.0.0.1:2", "-issuer-key", seed, "-hop", "1"}, ""},
		{"hop replicas", []string{"-store", "postgres", "-replicas", "3", "-hop", "0"}, ""},
		{"ok", []string{"-url", "http://127.0.0.1:1", "-issuer-key", seed}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig(tc.args, env(nil), io.Discard)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("err = %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestTargetsLoopbackOnly(t *testing.T) {
	seed := base64.StdEncoding.EncodeToString(make([]byte, ed25519.SeedSize))
	for _, tc := range []struct {
		url   string
		allow bool
		ok    bool
	}{
		{"http://127.0.0.1:8080", false, true},
		{"http://[::1]:8080", false, true},
		{"http://localhost:8080", false, true},
		{"http://10.0.0.1:8080", false, false},
		{"https://203.0.113.7", false, false},
		{"http://10.0.0.1:8080", true, true},
		{"ftp://127.0.0.1", false, false},
	} {
		args := []string{"-url", tc.url, "-issuer-key", seed}
		if tc.allow {
			args = append(args, "-allow-remote")
		}
		c, err := parseConfig(args, env(nil), io.Discard)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		err = c.checkTargets(context.Background())
		if (err == nil) != tc.ok {
			t.Errorf("%s allow=%v: err = %v, want ok=%v", tc.url, tc.allow, err, tc.ok)
		}
	}
}

func TestConfigNewModes(t *testing.T) {
	c, err := parseConfig([]string{"-crash", "20s,40", "-crash", "50s", "-ack", "explicit", "-relay-memory", "256MiB",
		"-relay-env", "FN_ACK_INTERVAL=1s", "-hostile", "3"},
		env(map[string]string{"LOAD_RELAY_ENV": "FN_BODY_TIMEOUT=2s FN_SEND_RATE=9"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := []time.Duration{20 * time.Second, 40 * time.Second, 50 * time.Second}; !slices.Equal(c.crashes, want) {
		t.Errorf("crashes = %v, want %v", c.crashes, want)
	}
	if c.ackMode != "explicit" || c.relayMemory != 256<<20 || c.hostile != 3 || c.crashReplica != -1 {
		t.Errorf("ack %q memory %d hostile %d crash replica %d", c.ackMode, c.relayMemory, c.hostile, c.crashReplica)
	}
	// A flag wins over its variable, repeatable ones too.
	if want := []string{"FN_ACK_INTERVAL=1s"}; !slices.Equal(c.relayEnv, want) {
		t.Errorf("relay env = %q, want %q", c.relayEnv, want)
	}
	if c.relay.AckInterval != time.Second || c.relay.ShutdownGrace != relayconfig.Default().ShutdownGrace {
		t.Errorf("relay config: ack interval %v, grace %v", c.relay.AckInterval, c.relay.ShutdownGrace)
	}

	// The variable alone: the relay reads each of its settings as the
	// relay would.
	c, err = parseConfig(nil, env(map[string]string{"LOAD_RELAY_ENV": "FN_BODY_TIMEOUT=2s FN_HOUSEHOLD_SEND_RATE=9"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.relay.BodyTimeout != 2*time.Second || c.relay.HouseholdSendRate != 9 {
		t.Errorf("relay config: body timeout %v, household rate %v", c.relay.BodyTimeout, c.relay.HouseholdSendRate)
	}
	for _, bad := range []string{"FN_BODY_TIMEOUT=soon", "FN_BODY_TIMEOUTS=2s"} {
		_, err := parseConfig([]string{"-relay-env", bad}, env(nil), io.Discard)
		if name, _, _ := strings.Cut(bad, "="); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("-relay-env %s: %v, want an error naming %s", bad, err, name)
		}
	}
	// A bad flag names the flag, a bad variable the variable.
	if _, err := parseConfig([]string{"-pairs", "many"}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "-pairs") {
		t.Errorf("-pairs many: %v", err)
	}
	if _, err := parseConfig(nil, env(map[string]string{"LOAD_PAIRS": "many"}), io.Discard); err == nil || !strings.Contains(err.Error(), "LOAD_PAIRS") {
		t.Errorf("LOAD_PAIRS=many: %v", err)
	}
}

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"256MiB", 256 << 20, true},
		{"1GiB", 1 << 30, true},
		{"4096", 4096, true},
		{"512 KiB", 512 << 10, true},
		{"100B", 100, true},
		{"1.5GiB", 0, false},
		{"-1MiB", 0, false},
		{"256MB", 0, false}, // GOMEMLIMIT has no decimal units either
		{"99999999999TiB", 0, false},
	} {
		got, err := parseBytes(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestRedact(t *testing.T) {
	got := redact([]string{"-issuer-key", "SECRET", "-pairs", "5", "--issuer-key=SECRET2"})
	if s := strings.Join(got, " "); strings.Contains(s, "SECRET") || !strings.Contains(s, "-pairs 5") {
		t.Errorf("redact = %q", got)
	}
}

// TestCampaignConfig: -faults brings its own defaults where no flag or
// variable was given, and refuses what it cannot run with.
func TestCampaignConfig(t *testing.T) {
	c, err := parseConfig([]string{"-faults", "0", "-pairs", "40"}, env(map[string]string{"LOAD_RATE": "10"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.faults == nil || *c.faults != 0 || c.store != "postgres" || c.replicas != 3 || c.pairs != 40 || c.rate != 10 || c.wait != 5 ||
		c.drain != 15*time.Second || c.faultGap != time.Second || !slices.Equal(c.faultKinds, faults.FaultKinds) || c.hop != 0.3 {
		t.Errorf("config %+v", c)
	}
	c, err = parseConfig([]string{"-pairs", "40"}, env(nil), &bytes.Buffer{})
	if err != nil || c.faults != nil || c.store != "sqlite" || c.replicas != 1 || c.hop != 0 {
		t.Errorf("without -faults: %+v, %v", c, err)
	}
	// -hop given, by flag or variable, wins over the campaign's.
	c, err = parseConfig([]string{"-faults", "1", "-hop", "0"}, env(nil), &bytes.Buffer{})
	if err != nil || c.hop != 0 {
		t.Errorf("-faults 1 -hop 0: hop %v, %v", c.hop, err)
	}
	c, err = parseConfig([]string{"-faults", "1"}, env(map[string]string{"LOAD_HOP": "1"}), &bytes.Buffer{})
	if err != nil || c.hop != 1 {
		t.Errorf("-faults 1, LOAD_HOP=1: hop %v, %v", c.hop, err)
	}
	// The help of -faults lists every default it sets.
	var help bytes.Buffer
	if _, err := parseConfig([]string{"-h"}, env(nil), &help); err == nil {
		t.Fatal("-h: no error")
	}
	_, listed, _ := strings.Cut(help.String(), "Unless given, ")
	listed, _, _ = strings.Cut(listed, "\n")
	for name, v := range campaignDefaults {
		if !strings.Contains(" "+listed+" ", " -"+name+" "+v+" ") {
			t.Errorf("-faults help %q does not list -%s %s", listed, name, v)
		}
	}
	c, err = parseConfig([]string{"-faults", "18446744073709551615", "-fault-kinds", "remove,pg-pause,remove"}, env(nil), &bytes.Buffer{})
	if err != nil || *c.faults != 1<<64-1 || !slices.Equal(c.faultKinds, []string{"remove", "pg-pause"}) {
		t.Errorf("largest seed, two kinds: %+v, %v", c, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-faults", "x"}, "seed"},
		{[]string{"-faults", "-1"}, "seed"},
		{[]string{"-faults", "1", "-fault-kinds", "pg-kil"}, "fault kinds"},
		{[]string{"-fault-kinds", "remove"}, "needs -faults"},
		{[]string{"-faults", "1", "-store", "sqlite"}, "-store postgres"},
		{[]string{"-faults", "1", "-replicas", "1"}, "-replicas 2"},
		{[]string{"-faults", "1", "-crash", "5s"}, "-crash"},
		{[]string{"-faults", "1", "-hostile", "2"}, "-hostile"},
		{[]string{"-faults", "1", "-pg", "postgres://x@127.0.0.1/y"}, "-pg"},
		{[]string{"-faults", "1", "-url", "http://127.0.0.1:1", "-issuer-key", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}, "throwaway"},
		{[]string{"-faults", "1", "-fault-gap", "0"}, "-fault-gap"},
		{[]string{"-faults", "1", "-duration", "4s"}, "-duration"},
	} {
		_, err := parseConfig(tc.args, env(nil), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}

func TestFailoverConfig(t *testing.T) {
	c, err := parseConfig([]string{"-failover", "sync", "-duration", "30s"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.store != "postgres" || c.failoverAt != 10*time.Second {
		t.Errorf("-failover sync: store %q, at %v; want postgres and a third of the duration", c.store, c.failoverAt)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"mode", []string{"-failover", "maybe"}, "sync or async"},
		{"sqlite", []string{"-failover", "sync", "-store", "sqlite"}, "-failover needs -store postgres"},
		{"pg", []string{"-failover", "sync", "-pg", "postgres://x@127.0.0.1/y"}, "-pg cannot be given"},
		{"crash", []string{"-failover", "sync", "-crash", "5s"}, "cannot be given with -faults or -crash"},
		{"late", []string{"-failover", "sync", "-duration", "10s", "-failover-at", "10s"}, "inside the offered duration"},
		{"async too early", []string{"-failover", "async", "-failover-at", "1s"}, "cuts replication"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig(tc.args, env(nil), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
