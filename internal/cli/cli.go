// Package cli is the relay binary's command line: one file per subcommand
// (serve, keygen, pubkey, token, migrate, backup, restore, send, listen,
// invite, pair, devices, remove, probe, version, help), the dispatch table
// that names them, and what they share. The module's root main.go calls
// [Main].
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/flamenet/relay/internal/config"
)

// Main runs the command line args (without the program's name) until it
// ends or an interrupt or SIGTERM stops it, and returns the exit code.
func Main(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, args, getenv, stdout, stderr)
	stop()
	var exit *exitError
	switch {
	case errors.As(err, &exit):
		if exit.err != nil {
			reportExit(stderr, args, getenv, exit.err)
		}
		return exit.code
	case err != nil:
		reportExit(stderr, args, getenv, err)
		return 1
	}
	return 0
}

// reportExit writes the error the program stops with: one JSON log line
// when the logs are JSON, so a collector sees nothing else, or a plain line.
func reportExit(w io.Writer, args []string, getenv func(string) string, err error) {
	format := getenv("FN_LOG_FORMAT")
	if cmd, rest := command(args); cmd == "serve" || cmd == "migrate" {
		// The configuration's own format, flag included, when it loads.
		fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		if cfg, lerr := config.Load(fs, rest, getenv); lerr == nil {
			format = cfg.LogFormat
		}
	}
	if format == "json" {
		slog.New(slog.NewJSONHandler(w, nil)).Error("relay stopped", "err", err.Error())
		return
	}
	fmt.Fprintln(w, "relay:", err)
}

// command splits the subcommand (serve when none is given) from its
// arguments.
func command(args []string) (string, []string) {
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		return args[0], args[1:]
	}
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		return "help", args[1:]
	}
	return "serve", args
}

// run runs the whole program; tests call it with their own arguments,
// environment and output. A request for help (-h, help) is not an error;
// a mistake on the command line is exit 2, whichever command made it.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	err := dispatch(ctx, args, getenv, stdout, stderr)
	var bad *config.FlagError
	var exit *exitError
	switch {
	case errors.Is(err, flag.ErrHelp):
		return nil
	case errors.As(err, &bad) && !errors.As(err, &exit):
		cmd, rest := command(args)
		if cmd == "token" && len(rest) > 0 && rest[0] == "check" {
			cmd = "token check" // its own flags
		}
		return usageErr("%s: %w (relay %s -h lists its flags)", cmd, err, cmd)
	}
	return err
}

// subcommand is one entry of the dispatch table.
type subcommand struct {
	name string
	run  func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error
}

// subcommands is the dispatch table, in the order relay help lists them.
// help is dispatch's own: it dispatches again.
var subcommands = []subcommand{
	{"serve", serve},
	{"keygen", func(_ context.Context, args []string, _ func(string) string, stdout, _ io.Writer) error {
		return keygen(args, stdout)
	}},
	{"pubkey", func(_ context.Context, args []string, getenv func(string) string, stdout, _ io.Writer) error {
		return pubkey(args, getenv, stdout)
	}},
	{"token", func(_ context.Context, args []string, getenv func(string) string, stdout, _ io.Writer) error {
		return mintToken(args, getenv, stdout)
	}},
	{"migrate", migrate},
	{"backup", backupCmd},
	{"restore", restoreCmd},
	{"send", sendCmd},
	{"listen", listenCmd},
	{"invite", inviteCmd},
	{"pair", pairCmd},
	{"devices", devicesCmd},
	{"remove", removeCmd},
	{"probe", func(ctx context.Context, args []string, _ func(string) string, stdout, _ io.Writer) error {
		return probe(ctx, args, stdout)
	}},
	{"version", func(_ context.Context, args []string, _ func(string) string, stdout, _ io.Writer) error {
		return versionCmd(args, stdout)
	}},
}

func dispatch(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd, args := command(args)
	if cmd == "help" {
		// relay help CMD is relay CMD -h; relay help -h is relay help.
		switch {
		case len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "-help" || args[0] == "--help":
			fmt.Fprintln(stdout, usage)
			return nil
		case strings.HasPrefix(args[0], "-"):
			return usageErr("help: flag provided but not defined: %s; relay help COMMAND", args[0])
		case len(args) > 1:
			return usageErr("help: unexpected argument %q; relay help COMMAND", args[1])
		}
		return dispatch(ctx, []string{args[0], "-h"}, getenv, stdout, stderr)
	}
	for _, c := range subcommands {
		if c.name == cmd {
			return c.run(ctx, args, getenv, stdout, stderr)
		}
	}
	return usageErr("unknown command %q; relay help lists them", cmd)
}

// flags returns a subcommand's flag set; its usage (-h) goes to stdout. about
// is a one-sentence description, then any more paragraphs.
func flags(name, synopsis, about string, stdout io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stdout)
	setHelp(fs, fmt.Sprintf("usage: %s\n\n%s", strings.TrimSpace("relay "+name+" "+synopsis), about))
	return fs
}

// setHelp makes fs's -h every command's layout: text (the usage lines, a
// blank line, the description), a blank line, then "flags:" and the flags.
func setHelp(fs *flag.FlagSet, text string) {
	fs.Usage = func() {
		w := fs.Output()
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n == 0 {
			fmt.Fprintf(w, "%s\n\nflags: none\n", text)
			return
		}
		fmt.Fprintf(w, "%s\n\nflags:\n", text)
		fs.PrintDefaults()
	}
}

// noFlags parses the arguments of a subcommand that takes none.
func noFlags(name, about string, args []string, stdout io.Writer) error {
	fs := flags(name, "", about, stdout)
	if _, err := config.Parse(fs, args, nil, noEnv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("%s: unexpected argument %q", name, fs.Arg(0))
	}
	return nil
}

func noEnv(string) string { return "" }

// exitError ends the program with code, after printing err (when set).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// usageErr returns a mistake on the command line, which exits 2.
func usageErr(format string, args ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, args...)}
}
