// Command relay stores end-to-end encrypted envelopes until each recipient
// device fetches them. Subcommands: serve (default), keygen, token,
// migrate, send, listen, invite, probe, version. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/flamenet/relay/config"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	var exit *exitError
	switch {
	case errors.As(err, &exit):
		if exit.err != nil {
			fmt.Fprintln(os.Stderr, "relay:", exit.err)
		}
		os.Exit(exit.code)
	case err != nil:
		reportExit(os.Stderr, os.Args[1:], os.Getenv, err)
		os.Exit(1)
	}
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

// run is the whole program; tests call it with their own arguments,
// environment and output. A request for help (-h, help) is not an error.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	err := dispatch(ctx, args, getenv, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

func dispatch(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd, args := command(args)
	switch cmd {
	case "serve":
		return serve(ctx, args, getenv, stdout, stderr)
	case "keygen":
		return keygen(args, stdout)
	case "token":
		return mintToken(args, getenv, stdout)
	case "pubkey":
		return pubkey(args, getenv, stdout)
	case "migrate":
		return migrate(ctx, args, getenv, stdout, stderr)
	case "send":
		return sendCmd(ctx, args, getenv, stdout, stderr)
	case "listen":
		return listenCmd(ctx, args, getenv, stdout, stderr)
	case "backup":
		return backupCmd(ctx, args, getenv, stdout, stderr)
	case "restore":
		return restoreCmd(ctx, args, getenv, stdout, stderr)
	case "invite":
		return inviteCmd(ctx, args, getenv, stdout, stderr)
	case "pair":
		return pairCmd(ctx, args, getenv, stdout, stderr)
	case "probe":
		return probe(ctx, args, stdout)
	case "version":
		if err := noFlags("version", "Print the version.", args, stdout); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "relay", readBuild())
		return nil
	case "help":
		// relay help CMD is relay CMD -h.
		if len(args) > 0 && args[0] != "help" {
			return dispatch(ctx, []string{args[0], "-h"}, getenv, stdout, stderr)
		}
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return fmt.Errorf("unknown command %q; relay help lists them", cmd)
}

// flags is a subcommand's flag set; its usage (-h) goes to stdout.
func flags(name, synopsis, about string, stdout io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s\n\n%s\n", strings.TrimSpace("relay "+name+" "+synopsis), about)
		fs.PrintDefaults()
	}
	return fs
}

// noFlags parses the arguments of a subcommand that takes none.
func noFlags(name, about string, args []string, stdout io.Writer) error {
	fs := flags(name, "", about, stdout)
	if _, err := config.Parse(fs, args, nil, noEnv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q", name, fs.Arg(0))
	}
	return nil
}

func noEnv(string) string { return "" }

// probe is a health check that needs nothing but this binary, for
// container images that have no shell or curl.
func probe(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flags("probe", "[URL]", "GET the URL (default http://127.0.0.1:8080/ready); exit 0 on 200.", stdout)
	if _, err := config.Parse(fs, args, nil, noEnv); err != nil {
		return err
	}
	target := "http://127.0.0.1:8080/ready"
	switch fs.NArg() {
	case 0:
	case 1:
		target = fs.Arg(0)
	default:
		return fmt.Errorf("probe: unexpected argument %q", fs.Arg(1))
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe: %s answered %s", target, resp.Status)
	}
	fmt.Fprintln(stdout, "ok")
	return nil
}

const usage = `usage: relay [command] [flags]; relay help COMMAND or relay COMMAND -h for its flags

commands:
  serve    run the relay (default); flags and FN_* variables: relay serve -h
  keygen   create an issuer key pair
  pubkey   print the public key of an issuer key file
  token    mint a device token with the issuer key;
           token check: show a token and whether the relay accepts it
  migrate  apply the store's migrations and exit
  backup   copy the SQLite database while the relay runs: relay backup FILE
  restore  put a backup in place of the SQLite database (relay stopped)
  send     send an envelope as a device: relay send -h
  listen   print a device's envelopes as JSON lines: relay listen -h
  invite   make a pairing code (and QR code) for a device: relay invite -h
  pair     redeem an invitation's code; keep the device's credentials in a
           file that send and listen take with -store: relay pair -h
  probe    GET a URL (default http://127.0.0.1:8080/ready), exit 0 on 200:
           a health check for images without a shell
  version  print the version
  help     this list; help COMMAND: the command's flags`
