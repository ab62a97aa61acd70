package cli

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"io"

	"github.com/flamenet/relay/internal/config"
)

// pubkey prints the public key of an issuer key file: what relays that
// mint nothing themselves put in FN_ISSUER_KEYS.
func pubkey(args []string, getenv func(string) string, stdout io.Writer) error {
	fset := flags("pubkey", "[-issuer-key-file FILE]", `Prints the public key of the issuer private key in FILE (default
FN_ISSUER_KEY_FILE, else data/issuer.key), as FN_ISSUER_KEYS takes it.`, stdout)
	keyFileSetting, _ := config.Lookup("FN_ISSUER_KEY_FILE")
	keyFile := fset.String("issuer-key-file", keyFileSetting.Default, "issuer private key file (env FN_ISSUER_KEY_FILE)")
	if _, err := config.Parse(fset, args, getenv, func(f string) string {
		if f == "issuer-key-file" {
			return "FN_ISSUER_KEY_FILE"
		}
		return ""
	}); err != nil {
		return err
	}
	if fset.NArg() > 0 {
		return usageErr("pubkey: unexpected argument %q", fset.Arg(0))
	}
	key, err := readIssuerKey(*keyFile)
	if err != nil {
		return fmt.Errorf("pubkey: %w", err)
	}
	pub := base64.StdEncoding.EncodeToString(key.Public().(ed25519.PublicKey))
	fmt.Fprintf(stdout, "public:  %s\n\ntrust it with FN_ISSUER_KEYS=%s\n", pub, pub)
	return nil
}
