package cli

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
)

// stdin is what `relay send` reads a payload from; tests replace it.
var stdin io.Reader = os.Stdin

// defaultRelayURL is -url's default.
const defaultRelayURL = "http://127.0.0.1:8080"

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

// envelopeLine is how listen prints an envelope.
type envelopeLine struct {
	Seq     int64  `json:"seq"`
	ID      string `json:"id"`
	From    string `json:"from"`
	SentAt  string `json:"sent_at"`
	Payload []byte `json:"payload"`
}
