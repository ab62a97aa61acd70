// Command relay stores end-to-end encrypted envelopes until each recipient
// device fetches them. Subcommands: serve (default), keygen, token,
// migrate, probe, version. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	var code exitError
	if errors.As(err, &code) {
		os.Exit(int(code))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
}

// exitError ends the program with its status and nothing more printed:
// the command has already said what it had to.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// run is the whole program; tests call it with their own arguments,
// environment and output.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, getenv, stdout, stderr)
	case "keygen":
		return keygen(args, stdout, stderr)
	case "token":
		return mintToken(args, getenv, stdout, stderr)
	case "migrate":
		return migrate(ctx, args, getenv, stdout, stderr)
	case "probe":
		return probe(ctx, args, stdout)
	case "version":
		fmt.Fprintln(stdout, "relay", readBuild())
		return nil
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

// probe is a health check that needs nothing but this binary, for
// container images that have no shell or curl.
func probe(ctx context.Context, args []string, stdout io.Writer) error {
	target := "http://127.0.0.1:8080/ready"
	if len(args) > 0 {
		target = args[0]
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

const usage = `usage: relay [command] [flags]

commands:
  serve    run the relay (default); flags and FN_* variables: relay serve -h
  keygen   create an issuer key pair
  token    mint a device token with the issuer key;
           token check: show a token and whether the relay accepts it
  migrate  apply the store's migrations and exit
  probe    GET a URL (default http://127.0.0.1:8080/ready), exit 0 on 200:
           a health check for images without a shell
  version  print the version`
