// Command relay stores end-to-end encrypted envelopes until each recipient
// device fetches them. Subcommands: serve (default), keygen, token,
// migrate, version. See README.md.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
}

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
	case "version":
		fmt.Fprintln(stdout, "relay", version())
		return nil
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

const usage = `usage: relay [command] [flags]

commands:
  serve    run the relay (default); flags and FN_* variables: relay serve -h
  keygen   create an issuer key pair
  token    mint a device token with the issuer key
  migrate  apply the store's migrations and exit
  version  print the version`
