package main

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
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

func TestRedact(t *testing.T) {
	got := redact([]string{"-issuer-key", "SECRET", "-pairs", "5", "--issuer-key=SECRET2"})
	if s := strings.Join(got, " "); strings.Contains(s, "SECRET") || !strings.Contains(s, "-pairs 5") {
		t.Errorf("redact = %q", got)
	}
}
