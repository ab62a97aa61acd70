package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/config"
)

// stdin is what `relay send` reads a payload from; tests replace it.
var stdin io.Reader = os.Stdin

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

// usageErr is a mistake on the command line: exit 2.
func usageErr(format string, args ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, args...)}
}

// defaultRelayURL is -url's default.
const defaultRelayURL = "http://127.0.0.1:8080"

// clientFlags are the flags `relay send` and `relay listen` share.
type clientFlags struct {
	url, token, tokenFile, codec, store string
}

func (f *clientFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "url", defaultRelayURL, "relay base URL (env FN_RELAY_URL)")
	fs.StringVar(&f.token, "token", "", "bearer token; else -token-file, else env FN_TOKEN")
	fs.StringVar(&f.tokenFile, "token-file", "", "file holding the bearer token")
	fs.StringVar(&f.codec, "codec", "json", "json or msgpack")
	fs.StringVar(&f.store, "store", "", "credentials file written by relay pair, renewed as needed (instead of a token)")
}

// client makes the relay client the flags describe; a missing token or a
// bad codec is a usage error.
func (f *clientFlags) client(ctx context.Context, getenv func(string) string, opts ...client.Option) (*client.Client, error) {
	if f.store != "" {
		return f.storeClient(ctx, opts...)
	}
	tok := f.token
	if tok == "" && f.tokenFile != "" {
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return nil, usageErr("-token-file: %w", err)
		}
		tok = string(b)
	}
	if tok == "" {
		tok = getenv("FN_TOKEN")
	}
	if strings.TrimSpace(tok) == "" {
		return nil, usageErr("no token: give -token, -token-file or FN_TOKEN")
	}
	codec, err := codecOption(f.codec)
	if err != nil {
		return nil, err
	}
	opts = append(opts, codec)
	c, err := client.New(f.url, tok, opts...)
	if err != nil {
		return nil, usageErr("%w", err)
	}
	return c, nil
}

// parseFlags parses args; -h prints the usage (usage, then the flags) on
// stdout and ends the command with exit 0, a bad flag is a usage mistake
// (run: exit 2).
func parseFlags(fs *flag.FlagSet, args []string, getenv func(string) string, usage string, stdout, stderr io.Writer) error {
	return parseFlagsEnv(fs, args, getenv, map[string]string{"url": "FN_RELAY_URL"}, usage, stdout, stderr) // FN_TOKEN comes after -token-file, in client
}

// parseFlagsEnv is parseFlags where env names the variable each flag
// reads when not given.
func parseFlagsEnv(fs *flag.FlagSet, args []string, getenv func(string) string, env map[string]string, usage string, stdout, _ io.Writer) error {
	fs.SetOutput(stdout)
	setHelp(fs, usage)
	_, err := config.Parse(fs, args, getenv, func(flag string) string { return env[flag] })
	return err
}

// logTo writes the client's diagnostics as lines on stderr.
func logTo(stderr io.Writer, cmd string) client.Option {
	return client.WithLogf(func(format string, args ...any) {
		fmt.Fprintf(stderr, "relay: %s\n", fmt.Sprintf(format, args...))
	})
}

const sendUsage = `usage: relay send [flags] -to dev1,dev2 [-id ID] [-seal -identity F] [PAYLOAD | -file F | -]

Sends PAYLOAD to the named devices of the token's household and prints the
relay's answer as one JSON line.

PAYLOAD is the argument's bytes, the file's, or stdin's with "-" or no
argument. The send is retried with the same id until the relay stores it
or refuses it for good. With -seal it registers the identity's key,
reads the directory, and seals PAYLOAD to the recipients' pinned keys; a
recipient whose key changed is refused until -trust names it.`

func sendCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	var cf clientFlags
	cf.bind(fs)
	to := fs.String("to", "", "comma-separated recipient devices")
	id := fs.String("id", "", "the send's id, the same for every retry (default: 16 random bytes, base64url)")
	file := fs.String("file", "", "send this file's bytes")
	timeout := fs.Duration("timeout", 60*time.Second, "give up after this long")
	var sf sealFlags
	sf.bind(fs, "seal", "seal the payload end to end to the recipients' pinned keys (docs/E2E.md)")
	if err := parseFlags(fs, args, getenv, sendUsage, stdout, stderr); err != nil {
		return err
	}
	var recipients []string
	for d := range strings.SplitSeq(*to, ",") {
		if d = strings.TrimSpace(d); d != "" {
			recipients = append(recipients, d)
		}
	}
	if len(recipients) == 0 {
		return usageErr("send: -to names no device")
	}
	if err := sf.check("seal"); err != nil {
		return err
	}
	if fs.NArg() > 1 || (fs.NArg() == 1 && *file != "") {
		return usageErr("send: give one payload: an argument, -file or stdin")
	}
	var payload []byte
	var err error
	switch {
	case *file != "":
		payload, err = os.ReadFile(*file)
	case fs.NArg() == 1 && fs.Arg(0) != "-":
		payload = []byte(fs.Arg(0))
	default:
		payload, err = io.ReadAll(stdin)
	}
	if err != nil {
		return fmt.Errorf("send: reading the payload: %w", err)
	}
	c, err := cf.client(ctx, getenv, logTo(stderr, "send"))
	if err != nil {
		return err
	}
	if *id == "" {
		*id = client.NewID()
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var res client.SendResult
	if sf.on {
		res, err = sf.send(ctx, c, *id, recipients, payload, stderr)
	} else {
		res, err = c.Send(ctx, *id, recipients, payload)
	}
	if err != nil {
		return fmt.Errorf("send: %w", cf.refused(ctx, err))
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = stdout.Write(append(b, '\n'))
	return err
}

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

// envelopeLine is how listen prints an envelope.
type envelopeLine struct {
	Seq     int64  `json:"seq"`
	ID      string `json:"id"`
	From    string `json:"from"`
	SentAt  string `json:"sent_at"`
	Payload []byte `json:"payload"`
}

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

// codecOption is -codec's client option.
func codecOption(codec string) (client.Option, error) {
	switch codec {
	case "json":
		return client.WithCodec(client.JSON), nil
	case "msgpack":
		return client.WithCodec(client.MessagePack), nil
	}
	return nil, usageErr("-codec %q: json or msgpack", codec)
}
