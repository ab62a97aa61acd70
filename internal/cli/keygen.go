package cli

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/flamenet/relay/internal/config"
)

func keygen(args []string, stdout io.Writer) error {
	fset := flags("keygen", "[-out FILE [-force]]", `Creates an Ed25519 issuer key pair.

The public key goes in the relays' FN_ISSUER_KEYS; the private key stays
with whoever mints tokens. Without -out the private key is printed; with
-out it is written to FILE, mode 0600, and an existing FILE is refused
unless -force.`, stdout)
	out := fset.String("out", "", "write the private key (base64 seed) to this file, mode 0600, instead of printing it")
	force := fset.Bool("force", false, "with -out, replace an existing key file (tokens signed by the old key stop verifying once relays stop trusting it)")
	if _, err := config.Parse(fset, args, nil, noEnv); err != nil {
		return err
	}
	if fset.NArg() > 0 {
		return usageErr("keygen: unexpected argument %q", fset.Arg(0))
	}
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	seed := base64.StdEncoding.EncodeToString(key.Seed())
	if *out != "" {
		if err := writeKeyFile(*out, seed, *force); err != nil {
			return fmt.Errorf("keygen: %w", err)
		}
		fmt.Fprintf(stdout, "private key written to %s\n", *out)
	} else {
		fmt.Fprintf(stdout, "private: %s\n", seed)
	}
	fmt.Fprintf(stdout, "public:  %s\n\ntrust it with FN_ISSUER_KEYS=%s\n", base64.StdEncoding.EncodeToString(pub), base64.StdEncoding.EncodeToString(pub))
	return nil
}

// writeKeyFile writes seed to path, mode 0600. An existing file is refused
// unless force; then it is replaced whole (a new 0600 file renamed over it,
// so a file that was readable by others does not keep its mode).
func writeKeyFile(path, seed string, force bool) error {
	if !force {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s exists; -force replaces it", path)
		}
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintln(f, seed); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".keygen-*") // mode 0600
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // fails harmlessly after the rename
	if _, err := fmt.Fprintln(f, seed); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
