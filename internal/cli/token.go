package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/token"
)

func mintToken(args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "check" {
		return checkToken(args[1:], getenv, stdout)
	}
	fset := flags("token", `-device DEVICE [-household HOME] [-scope device|admin] [-ttl 24h] [-issuer-key-file FILE]
       relay token check [flags] TOKEN|-     (relay token check -h)`, `Mints a device token signed with the issuer private key and prints it.

The key is read from -issuer-key-file when given, else from
FN_ISSUER_PRIVATE_KEY (a base64 seed) when set, else from
FN_ISSUER_KEY_FILE (default data/issuer.key); never from the command line,
where it would land in shell history and process listings.`, stdout)
	keyFileSetting, _ := config.Lookup("FN_ISSUER_KEY_FILE")
	household := fset.String("household", "home", "household (hh claim)")
	device := fset.String("device", "", "device (sub claim)")
	scope := fset.String("scope", token.ScopeDevice, "device or admin")
	ttl := fset.Duration("ttl", 24*time.Hour, "how long the token is valid")
	keyFile := fset.String("issuer-key-file", keyFileSetting.Default, "issuer private key file (env FN_ISSUER_KEY_FILE), the relay's own flag's name")
	if _, err := config.Parse(fset, args, getenv, noEnv); err != nil {
		return err
	}
	if fset.NArg() > 0 {
		return usageErr("token: unexpected argument %q", fset.Arg(0))
	}
	if *device == "" {
		return usageErr("token: -device is required")
	}
	if *scope != token.ScopeDevice && *scope != token.ScopeAdmin {
		return usageErr("token: -scope %q: want device or admin", *scope)
	}
	key, _, err := cliIssuerKey(fset, *keyFile, getenv)
	if err != nil {
		return fmt.Errorf("token: issuer key: %w", err)
	}
	now := time.Now()
	tok, err := token.Mint(key, token.Claims{Household: *household, Device: *device, Scope: *scope, IssuedAt: now, Expires: now.Add(*ttl)})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	return nil
}
