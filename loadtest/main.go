// Command loadtest offers the relay a fixed open-loop load over real HTTP
// and checks that every accepted send is delivered exactly once, in order.
//
//	go run ./loadtest -pairs 1000 -rate 100 -duration 60s
//
// Without -url it builds the relay from this checkout and boots a
// throwaway stack; with -url it targets a running one (loopback only unless
// -allow-remote). It prints one summary line, writes a JSON report with
// -out, and exits 1 on any loss, duplicate, reordering or unexpected error.
//
//	go run ./loadtest -faults 7
//
// runs a fault campaign drawn from seed 7: relays, and a Postgres and a
// Redis of the tester's own, killed, paused and restarted under the load,
// with devices removed and registered again (docs/CAPACITY.md, "Fault
// campaign").
package main

import (
	"context"
	"errors"
	"flag"
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
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errChecksFailed):
		// The summary line and the report already say why.
		os.Exit(1)
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		// Interrupted: the stack is already torn down; no report is
		// written, since a partial run is no evidence.
		fmt.Fprintln(os.Stderr, "loadtest: interrupted")
		os.Exit(130)
	default:
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

// errChecksFailed: the run completed and its report says what failed.
var errChecksFailed = errors.New("delivery checks failed")

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	return load(ctx, cfg, stdout, stderr)
}
