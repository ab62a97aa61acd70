package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/internal/config"
)

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

// codecOption returns -codec's client option.
func codecOption(codec string) (client.Option, error) {
	switch codec {
	case "json":
		return client.WithCodec(client.JSON), nil
	case "msgpack":
		return client.WithCodec(client.MessagePack), nil
	}
	return nil, usageErr("-codec %q: json or msgpack", codec)
}
