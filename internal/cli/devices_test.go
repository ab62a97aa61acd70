package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDevicesAndRemove: against a real relay that pairs devices, relay
// devices lists the household's devices, each with when it was last
// seen, its push kind and its key's fingerprint (the digits relay pair
// -identity printed); relay remove NAME removes one, whose credentials
// then stop working, and says so; removing it again is the relay's 404,
// exit 1. The admin token is the issuer key's, as relay invite's.
func TestDevicesAndRemove(t *testing.T) {
	p, base, keyFile := startPairing(t, nil)
	dir := filepath.Dir(keyFile) // its directory, the test's own
	ctx := context.Background()
	relayCmd := func(args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		err := run(ctx, args, noEnv, &stdout, &stderr)
		return stdout.String(), err
	}
	admin := []string{"-household", "flat", "-url", base, "-issuer-key-file", keyFile}

	if out, err := relayCmd(append([]string{"devices"}, admin...)...); err != nil || out != "no devices in household \"flat\"\n" {
		t.Fatalf("devices of an empty household: %v, %q", err, out)
	}
	fingerprints := map[string]string{}
	for _, dev := range []string{"phone", "laptop"} {
		out, err := relayCmd(append(append([]string{"invite"}, admin...), "-device", dev)...)
		if err != nil {
			t.Fatalf("invite %s: %v", dev, err)
		}
		code := regexp.MustCompile(`(?m)^  code: +(\S+)$`).FindStringSubmatch(out)
		if code == nil {
			t.Fatalf("invite printed no code:\n%s", out)
		}
		out, err = relayCmd("pair", "-url", base, "-code", code[1], "-store", filepath.Join(dir, dev+".json"), "-identity", filepath.Join(dir, dev+".id"))
		if err != nil {
			t.Fatalf("pair %s: %v", dev, err)
		}
		fp := regexp.MustCompile(`(?m)^fingerprint: (.+)$`).FindStringSubmatch(out)
		if fp == nil {
			t.Fatalf("pair printed no fingerprint:\n%s", out)
		}
		fingerprints[dev] = fp[1]
	}

	out, err := relayCmd(append([]string{"devices"}, admin...)...)
	if err != nil {
		t.Fatalf("devices: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("devices printed %d lines, want laptop and phone:\n%s", len(lines), out)
	}
	for i, dev := range []string{"laptop", "phone"} {
		want := `^` + dev + `: last seen \S+Z, registered \S+Z, push none; fingerprint ` + fingerprints[dev] + `$`
		if !regexp.MustCompile(want).MatchString(lines[i]) {
			t.Errorf("line %d: %q, want %s", i+1, lines[i], want)
		}
	}

	out, err = relayCmd(append(append([]string{"remove"}, admin...), "phone")...)
	if err != nil || !strings.HasPrefix(out, `removed device "phone" of household "flat"`) {
		t.Fatalf("remove phone: %v, %q", err, out)
	}
	removed := out
	if out, err := relayCmd(append([]string{"devices"}, admin...)...); err != nil || !strings.HasPrefix(out, "laptop: ") || strings.Contains(out, "phone") {
		t.Errorf("devices after the removal: %v\n%s", err, out)
	}
	// The removed phone's credentials are refused.
	err = run(ctx, []string{"send", "-store", filepath.Join(dir, "phone.json"), "-to", "laptop", "hi"}, noEnv, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("send as the removed phone: %v, want a 401", err)
	}
	_, err = relayCmd(append(append([]string{"remove"}, admin...), "phone")...)
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), `"phone"`) {
		t.Errorf("remove of no such device: %v (exit %d), want a 404 naming it, exit 1", err, exitCode(err))
	}

	// remove and the removed device's listener name the same invitation,
	// and it pairs the device again: a removed device is gone, so it
	// needs no -replace. Seen red when remove named the household of
	// none and the listener -replace.
	again := "relay invite -household flat -device phone"
	if !strings.HasSuffix(removed, "; "+again+" pairs it again\n") {
		t.Errorf("remove says %q, want it to end with %q", removed, again+" pairs it again")
	}
	err = run(ctx, []string{"listen", "-store", filepath.Join(dir, "phone.json"), "-wait", "1"}, noEnv, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "("+again+", then relay pair -url "+base+" ") {
		t.Errorf("listen as the removed phone: %v, want it to name %q", err, again)
	}
	out, err = relayCmd(append(strings.Fields(again)[1:], "-url", base, "-issuer-key-file", keyFile)...)
	code := regexp.MustCompile(`(?m)^  code: +(\S+)$`).FindStringSubmatch(out)
	if err != nil || code == nil {
		t.Fatalf("%s: %v\n%s", again, err, out)
	}
	if out, err := relayCmd("pair", "-url", base, "-code", code[1], "-store", filepath.Join(dir, "phone-again.json")); err != nil || !strings.HasPrefix(out, `paired as device "phone" of household "flat"`) {
		t.Errorf("pairing the removed phone again: %v, %q", err, out)
	}

	// Mistakes on the command line: exit 2, and nothing removed.
	for _, args := range [][]string{
		append([]string{"remove"}, admin...),                                        // no NAME
		append(append([]string{"remove"}, admin...), "laptop", "phone"),             // two
		append(append([]string{"devices"}, admin...), "laptop"),                     // devices takes none
		{"remove", "-url", base, "-issuer-key-file", keyFile, "-household", "flat"}, // no NAME again, flags in another order
	} {
		if _, err := relayCmd(args...); exitCode(err) != 2 {
			t.Errorf("%q: %v, want exit 2", args, err)
		}
	}
	// A key the relay does not trust: the relay's 401 and what it means.
	other := filepath.Join(dir, "other.key")
	if _, err := relayCmd("keygen", "-out", other); err != nil {
		t.Fatal(err)
	}
	_, err = relayCmd("devices", "-household", "flat", "-url", base, "-issuer-key-file", other)
	if err == nil || !strings.Contains(err.Error(), "does not trust this issuer key") {
		t.Errorf("devices with another key: %v", err)
	}
	if out, err := relayCmd(append([]string{"devices"}, admin...)...); err != nil || !strings.HasPrefix(out, "laptop: ") {
		t.Errorf("devices at the end: %v\n%s", err, out)
	}

	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`method=DELETE route=/v1/devices/\{device\} status=204 .*household=flat device=relay-cli`).MatchString(p.logs()) {
		t.Errorf("no access line of the removal by relay-cli:\n%s", p.logs())
	}
}
