package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/flamenet/relay/client"
)

const listenUsage = `usage: relay listen [flags] [-cursor-file F] [-wait 20] [-count N] [-open -identity F]

Holds polls for the token's device and prints each envelope once, in seq
order, as one JSON line.

A line is {"seq","id","from","sent_at","payload" (base64)}. The cursor,
with the store epoch it belongs to, is saved to -cursor-file after each
line (in memory without it), and acknowledged to the relay before it exits
(after -count envelopes, SIGINT or SIGTERM).
With -open it registers the identity's key and opens each sealed envelope:
"payload" is the plaintext, or "error" names why it did not open. One
sealed with a sender key that changed is also kept in the identity file's
name + .held, and printed again, opened, after -trust names its sender,
unless -drop discards it.
SIGINT or SIGTERM stops it cleanly.`

func listenCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("listen", flag.ContinueOnError)
	var cf clientFlags
	cf.bind(fs)
	cursorFile := fs.String("cursor-file", "", "keep the cursor and its store epoch in this file (default: in memory, from 0)")
	wait := fs.Int("wait", client.DefaultWait, "seconds a poll may be held")
	count := fs.Int("count", 0, "exit after this many envelopes (0: never)")
	var sf sealFlags
	sf.bind(fs, "open", `open sealed envelopes (docs/E2E.md): "payload" is the plaintext, or "error" says why it did not open`)
	sf.bindDrop(fs)
	if err := parseFlags(fs, args, getenv, listenUsage, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("listen: unexpected argument %q", fs.Arg(0))
	}
	if *wait < 1 || *count < 0 {
		return usageErr("listen: -wait must be at least 1 and -count not negative")
	}
	if err := sf.check("open"); err != nil {
		return err
	}
	c, err := cf.client(ctx, getenv, client.WithWait(*wait), logTo(stderr, "listen"))
	if err != nil {
		return err
	}
	var cursors client.CursorStore = &client.MemoryCursor{}
	if *cursorFile != "" {
		cursors = client.FileCursor(*cursorFile)
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	handled := 0
	emit := func(line any) error {
		b, err := json.Marshal(line)
		if err != nil {
			return err
		}
		// One write per line: nothing buffered to lose.
		if _, err := stdout.Write(append(b, '\n')); err != nil {
			return err
		}
		if handled++; handled == *count {
			stop() // Listen saves this envelope's cursor, then returns
		}
		return nil
	}
	if sf.on {
		err = sf.listen(ctx, c, cursors, emit, stderr)
	} else {
		err = c.Listen(ctx, cursors, func(ctx context.Context, e client.Envelope) error {
			return emit(envelopeLine(e))
		})
	}
	if err != nil {
		return fmt.Errorf("listen: %w", cf.refused(ctx, err))
	}
	ackSaved(ctx, c, cursors, stderr)
	return nil
}

// ackSaved acknowledges the saved position to the relay. Listen only
// acknowledges with its next poll, which a stopped listen never makes:
// without this, the next listener is handed the last envelopes again. A
// failure is said, not fatal: what was printed stays printed.
func ackSaved(ctx context.Context, c *client.Client, cursors client.CursorStore, stderr io.Writer) {
	pos, err := cursors.Load(ctx)
	if err != nil || pos.Cursor == 0 {
		return
	}
	// Stopping cancelled ctx; the ack still gets a bounded moment.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := c.Ack(ctx, pos); err != nil {
		fmt.Fprintf(stderr, "relay: listen: acknowledging seq %d: %v; the next listen may print it again\n", pos.Cursor, err)
	}
}
