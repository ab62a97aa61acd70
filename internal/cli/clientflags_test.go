package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

// TestClientCommandsUsage: -h prints the usage on stdout and exits 0; a
// bad flag or a missing token is a usage mistake, exit 2.
func TestClientCommandsUsage(t *testing.T) {
	noEnv := func(string) string { return "" }
	tests := []struct {
		args   []string
		code   int
		stdout string
	}{
		{[]string{"send", "-h"}, 0, "usage: relay send"},
		{[]string{"listen", "-h"}, 0, "usage: relay listen"},
		{[]string{"listen", "-bogus"}, 2, ""},
		{[]string{"send", "-to", "phone", "x"}, 2, ""},
		{[]string{"listen"}, 2, ""},
		{[]string{"send", "-token", "t", "x"}, 2, ""},                              // no -to
		{[]string{"send", "-token", "t", "-to", "a", "-codec", "xml", "x"}, 2, ""}, // unknown codec
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), tt.args, noEnv, &stdout, &stderr)
		exit := &exitError{} // nil: exit 0
		if err != nil && !errors.As(err, &exit) {
			exit.code = 1
		}
		if exit.code != tt.code {
			t.Errorf("%q: %v, want exit %d", tt.args, err, tt.code)
			continue
		}
		if !strings.HasPrefix(stdout.String(), tt.stdout) || (tt.stdout == "" && stdout.Len() > 0) {
			t.Errorf("%q: stdout %q", tt.args, stdout.String())
		}
		if tt.code == 2 && exit.err == nil && stderr.Len() == 0 {
			t.Errorf("%q: exit 2 without a message", tt.args)
		}
	}
}
