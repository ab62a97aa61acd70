package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/seal"
)

// sealFlags are the flags of `relay send -seal` and `relay listen -open`.
type sealFlags struct {
	on       bool
	identity string
	keyring  string
	trust    string
	drop     string // listen only
}

func (f *sealFlags) bind(fs *flag.FlagSet, name, usage string) {
	fs.BoolVar(&f.on, name, false, usage)
	fs.StringVar(&f.identity, "identity", "", "with -"+name+": the device's identity (a seed file), created 0600 when missing")
	fs.StringVar(&f.keyring, "keyring", "", "with -"+name+": the keys pinned for the other devices (default: the identity file's name + .pins)")
	fs.StringVar(&f.trust, "trust", "", "with -"+name+": comma-separated devices whose key, as the directory lists it now, replaces their pin (compare its fingerprint first)")
}

// bindDrop adds listen's -drop.
func (f *sealFlags) bindDrop(fs *flag.FlagSet) {
	fs.StringVar(&f.drop, "drop", "", "with -open: comma-separated devices whose held-back envelopes (sealed with a key not trusted) are discarded")
}

// check refuses -identity, -keyring, -trust and -drop without -seal
// (-open), which would otherwise send or print plain envelopes unasked.
func (f *sealFlags) check(name string) error {
	if !f.on && (f.identity != "" || f.keyring != "" || f.trust != "" || f.drop != "") {
		return usageErr("-identity, -keyring, -trust and -drop go with -%s", name)
	}
	return nil
}

// held returns where listen -open keeps the envelopes it held back, beside the
// identity whose device they were sent to.
func (f *sealFlags) held() client.FileHeld { return client.FileHeld(f.identity + ".held") }

// sealer loads or creates the identity, opens the keyring, registers the
// identity's key and trusts the devices -trust names.
func (f *sealFlags) sealer(ctx context.Context, c *client.Client, stderr io.Writer) (*client.Sealer, error) {
	if f.identity == "" {
		return nil, usageErr("-identity names no file")
	}
	id, created, err := seal.LoadOrCreateIdentity(f.identity)
	if err != nil {
		return nil, err
	}
	pins := f.keyring
	if pins == "" {
		pins = f.identity + ".pins"
	}
	ring, err := seal.OpenKeyring(ctx, seal.FileStore(pins), seal.OnKeyChange(func(kc seal.KeyChange) {
		fmt.Fprintf(stderr, "relay: %v; nothing is sealed to it or opened from it until -trust %s\n", kc, kc.Device)
	}))
	if err != nil {
		return nil, err
	}
	s, err := c.NewSealer(ctx, id, ring)
	if err != nil {
		return nil, err
	}
	if created {
		// The one time it is news: the user compares it with what the
		// other devices print when this key reaches them.
		fmt.Fprintf(stderr, "relay: created the identity %s; %s's fingerprint: %s\n", f.identity, s.Device(), s.Fingerprint())
	}
	for d := range strings.SplitSeq(f.trust, ",") {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		key, err := s.TrustListed(ctx, d)
		if err != nil {
			return nil, fmt.Errorf("-trust %s: %w", d, err)
		}
		fmt.Fprintf(stderr, "relay: trusting %s's key, fingerprint %s\n", d, seal.Fingerprint(key))
	}
	return s, nil
}

func (f *sealFlags) send(ctx context.Context, c *client.Client, id string, to []string, payload []byte, stderr io.Writer) (client.SendResult, error) {
	s, err := f.sealer(ctx, c, stderr)
	if err != nil {
		return client.SendResult{}, err
	}
	return s.SendSealed(ctx, id, to, payload)
}

// openedLine is how listen -open prints an envelope: the plaintext as
// payload (base64), or null and the seal error's code.
type openedLine struct {
	Seq     int64  `json:"seq"`
	ID      string `json:"id"`
	From    string `json:"from"`
	SentAt  string `json:"sent_at"`
	Payload []byte `json:"payload"`
	Error   string `json:"error,omitempty"`
}

func (f *sealFlags) listen(ctx context.Context, c *client.Client, cursors client.CursorStore, emit func(any) error, stderr io.Writer) error {
	s, err := f.sealer(ctx, c, stderr)
	if err != nil {
		return err
	}
	held := f.held()
	for d := range strings.SplitSeq(f.drop, ",") {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		n, err := s.DropHeld(ctx, held, d)
		if err != nil {
			return fmt.Errorf("-drop %s: %w", d, err)
		}
		fmt.Fprintf(stderr, "relay: dropped %d held-back envelopes from %s\n", n, d)
	}
	return s.ListenSealed(ctx, cursors, held, func(ctx context.Context, e client.Envelope, plaintext []byte, openErr error) error {
		line := openedLine{Seq: e.Seq, ID: e.ID, From: e.From, SentAt: e.SentAt, Payload: plaintext}
		if openErr != nil {
			line.Error = seal.Code(openErr)
			fmt.Fprintf(stderr, "relay: envelope %d from %s does not open: %v\n", e.Seq, e.From, openErr)
			if errors.Is(openErr, seal.ErrKeyChanged) {
				fmt.Fprintf(stderr, "relay: envelope %d from %s is held back in %s: it opens once -trust %s accepts the new key (compare fingerprints first), or -drop %s discards it\n", e.Seq, e.From, held, e.From, e.From)
			}
		}
		return emit(line)
	})
}
