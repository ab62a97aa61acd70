package cli

import (
	"bytes"
	"context"
	"errors"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/flamenet/relay/internal/config"
)

// commandNames is every name dispatch takes: the table's, and help.
func commandNames() []string {
	names := []string{"help"}
	for _, c := range subcommands {
		names = append(names, c.name)
	}
	return names
}

// exitCode is the status the binary ends with for run's error.
func exitCode(err error) int {
	var exit *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.code
	}
	return 1
}

// helpOf is CMD -h's output; it fails the test unless it went to stdout
// alone with exit 0.
func helpOf(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append(args, "-h"), noEnv, &stdout, &stderr)
	if code := exitCode(err); code != 0 || stderr.Len() > 0 {
		t.Errorf("%q -h: exit %d (%v), stderr %q", args, code, err, stderr.String())
	}
	return stdout.String()
}

var (
	flagLine = regexp.MustCompile(`^  -[a-z][a-z0-9-]*( .*)?$`)
	flagHelp = regexp.MustCompile(`^    \t`)
)

// TestEveryCommandHelp: every command of the dispatch table answers -h on
// stdout with exit 0 and one layout: the usage line(s), a one-sentence
// description, maybe more paragraphs, then the flags under "flags:" (or
// "flags: none") and nothing after them but flags.
func TestEveryCommandHelp(t *testing.T) {
	for _, name := range commandNames() {
		if name == "help" {
			continue // relay help prints the command list, below
		}
		out := helpOf(t, name)
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if !strings.HasPrefix(lines[0], "usage: relay "+name+" ") && lines[0] != "usage: relay "+name {
			t.Errorf("%s -h: the first line is %q, want usage: relay %s ...", name, lines[0], name)
			continue
		}
		i := 1
		for i < len(lines) && strings.HasPrefix(lines[i], "       relay ") {
			i++
		}
		if i+2 >= len(lines) || lines[i] != "" || lines[i+1] == "" {
			t.Errorf("%s -h: no description after a blank line below the usage:\n%s", name, out)
			continue
		}
		var sentence []string
		for i++; i < len(lines) && lines[i] != ""; i++ {
			sentence = append(sentence, lines[i])
		}
		if s := strings.Join(sentence, " "); !strings.HasSuffix(s, ".") || strings.Contains(s, ". ") {
			t.Errorf("%s -h: the description is not one sentence: %q", name, s)
		}
		heading := -1
		for j := i; j < len(lines); j++ {
			if lines[j] == "flags:" || lines[j] == "flags: none" {
				if heading >= 0 {
					t.Errorf("%s -h: two flags headings:\n%s", name, out)
				}
				heading = j
			}
		}
		if heading < 0 || lines[heading-1] != "" {
			t.Errorf("%s -h: no flags: heading after a blank line:\n%s", name, out)
			continue
		}
		rest := lines[heading+1:]
		if lines[heading] == "flags: none" && len(rest) > 0 || lines[heading] == "flags:" && len(rest) == 0 {
			t.Errorf("%s -h: %q with %d lines after it", name, lines[heading], len(rest))
		}
		for _, l := range rest {
			if !flagLine.MatchString(l) && !flagHelp.MatchString(l) {
				t.Errorf("%s -h: %q under flags: is not a flag", name, l)
			}
		}
	}
	// help: the list, which names every command.
	list := helpOf(t, "help")
	for _, name := range commandNames() {
		if !regexp.MustCompile(`(?m)^  ` + name + ` `).MatchString(list) {
			t.Errorf("relay help does not list %s:\n%s", name, list)
		}
	}
}

// TestEveryListNamesEveryCommand: the lists of subcommands (the package
// comment, README's Commands, ARCHITECTURE.md's row for internal/cli) name
// every command of the dispatch table; relay help's is TestEveryCommandHelp's.
func TestEveryListNamesEveryCommand(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "internal/cli/cli.go", nil, parser.PackageClauseOnly|parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	section := func(path, from, to string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		_, s, ok := strings.Cut(string(b), from)
		s, _, _ = strings.Cut(s, to)
		if !ok {
			t.Fatalf("%s has no %q", path, from)
		}
		return s
	}
	lists := map[string]string{
		"the package comment":            f.Doc.Text(),
		"README.md's Commands":           section("README.md", "## Commands\n", "\n## "),
		"ARCHITECTURE.md's internal/cli": section("docs/ARCHITECTURE.md", "| `internal/cli` |", "\n"),
	}
	for where, list := range lists {
		for _, c := range subcommands {
			if !regexp.MustCompile(`\b` + c.name + `\b`).MatchString(list) {
				t.Errorf("%s does not name %s: %q", where, c.name, list)
			}
		}
	}
}

// TestUsageMistakesExit2: an unknown flag, and too many arguments, are
// usage mistakes for every command: exit 2 with one line that says what
// was wrong, nothing on stdout. So is an unknown command.
func TestUsageMistakesExit2(t *testing.T) {
	dir := t.TempDir()
	vars := env(map[string]string{"FN_DATABASE_URL": "sqlite:" + filepath.Join(dir, "r.db"), "FN_LISTEN": "127.0.0.1:0",
		"FN_ISSUER_KEY_FILE": filepath.Join(dir, "issuer.key"), "FN_RELAY_URL": "http://127.0.0.1:1"})
	cases := [][]string{{"no-such-command"}, {"help", "no-such-command"}}
	for _, name := range commandNames() {
		cases = append(cases,
			[]string{name, "-no-such-flag"},
			[]string{name, "-no-such-flag=1", "x"},
			[]string{name, "a1", "a2", "a3", "a4", "a5", "a6"})
	}
	for _, args := range cases {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), args, vars, &stdout, &stderr)
		var exit *exitError
		if !errors.As(err, &exit) || exit.code != 2 {
			t.Errorf("%q: %v (exit %d), want exit 2", args, err, exitCode(err))
			continue
		}
		msg := stderr.String()
		if exit.err != nil {
			msg += exit.err.Error()
		}
		if msg == "" || strings.Count(strings.TrimSpace(msg), "\n") > 0 || stdout.Len() > 0 {
			t.Errorf("%q: want one line saying why, nothing on stdout; got %q, stdout %q", args, msg, stdout.String())
		}
		if strings.HasPrefix(args[len(args)-1], "-no-such-flag") && !strings.Contains(msg, "-no-such-flag") {
			t.Errorf("%q: %q does not name the flag", args, msg)
		}
	}
	// The binary's status.
	for _, args := range [][]string{{"keygen", "-bogus"}, {"serve", "-max-wait-secs", "soon"}, {"backup"}} {
		cmd := exec.Command(relayBin, args...)
		cmd.Env = []string{"FN_DATABASE_URL=sqlite:" + filepath.Join(dir, "r.db")}
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || strings.Count(string(out), "\n") != 1 {
			t.Errorf("relay %q: %v, %q; want exit 2 with one line", args, err, out)
		}
	}
}

// TestOneFlagPerSetting: no command has two names for one thing: a flag
// that reads an FN_* setting is named as serve names it, no two flags of
// a command read the same variable, and none is an alias of another or
// merely refused.
func TestOneFlagPerSetting(t *testing.T) {
	envOf := regexp.MustCompile(`\benv (FN_[A-Z0-9_]+)`)
	helps := map[string]string{"token check": helpOf(t, "token", "check")}
	for _, c := range subcommands {
		helps[c.name] = helpOf(t, c.name)
	}
	for name, out := range helps {
		_, flagsPart, _ := strings.Cut(out, "\nflags:")
		byVar := map[string]string{}
		flag := ""
		for _, l := range strings.Split(flagsPart, "\n") {
			if flagLine.MatchString(l) {
				flag = strings.Fields(l)[0][1:]
			}
			if strings.Contains(l, "the same as") || strings.Contains(l, "refused") {
				t.Errorf("%s -%s: %q", name, flag, strings.TrimSpace(l))
			}
			for _, m := range envOf.FindAllStringSubmatch(l, -1) {
				if other, ok := byVar[m[1]]; ok && other != flag {
					t.Errorf("%s: -%s and -%s both read %s", name, other, flag, m[1])
				}
				byVar[m[1]] = flag
				if s, ok := config.Lookup(m[1]); ok && s.Flag() != flag {
					t.Errorf("%s: -%s reads %s, whose flag is -%s", name, flag, m[1], s.Flag())
				}
			}
		}
	}
}

// TestMigrateTakesItsOwnSettings: migrate -h lists the settings migrate
// uses (the database and the logs), not serve's other ones, and refuses
// those as flags; it still reads its own.
func TestMigrateTakesItsOwnSettings(t *testing.T) {
	out := helpOf(t, "migrate")
	for _, f := range []string{"-database-url", "-sqlite-synchronous", "-store-lock-timeout", "-pg-max-connections-per-loop", "-log-level", "-log-format"} {
		if !strings.Contains(out, "  "+f+" ") {
			t.Errorf("migrate -h lacks %s:\n%s", f, out)
		}
	}
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if flagLine.MatchString(l) {
			n++
		}
	}
	if n != 6 {
		t.Errorf("migrate -h lists %d flags, want 6:\n%s", n, out)
	}
	dir := t.TempDir()
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"migrate", "-database-url", "sqlite:" + filepath.Join(dir, "m.db")}, noEnv, &stdout, &bytes.Buffer{}); err != nil || !strings.Contains(stdout.String(), "migrations applied") {
		t.Errorf("migrate -database-url: %v, %q", err, stdout.String())
	}
	err := run(context.Background(), []string{"migrate", "-max-wait-secs", "5"}, noEnv, &bytes.Buffer{}, &bytes.Buffer{})
	if exitCode(err) != 2 {
		t.Errorf("migrate -max-wait-secs: %v, want exit 2", err)
	}
	// A bad setting in the environment is not a usage mistake: exit 1.
	err = run(context.Background(), []string{"migrate"}, env(map[string]string{"FN_DATABASE_URL": "mysql://x"}), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "FN_DATABASE_URL") {
		t.Errorf("migrate with FN_DATABASE_URL=mysql://x: %v (exit %d), want exit 1 naming it", err, exitCode(err))
	}
}
