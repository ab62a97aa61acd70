package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/flamenet/relay/config"
	"github.com/flamenet/relay/token"
)

// loadOrCreateIssuerKey reads the base64 Ed25519 seed in path, or creates
// one (mode 0600) when the file does not exist.
func loadOrCreateIssuerKey(path string) (key ed25519.PrivateKey, created bool, err error) {
	key, err = readIssuerKey(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, err
	}
	_, key, err = ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, false, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, false, err
	}
	if _, err := fmt.Fprintln(f, base64.StdEncoding.EncodeToString(key.Seed())); err != nil {
		f.Close()
		return nil, false, err
	}
	return key, true, f.Close()
}

func readIssuerKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseSeed(strings.TrimSpace(string(b)))
}

func parseSeed(s string) (ed25519.PrivateKey, error) {
	seed, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, errors.New("an issuer private key is a base64 32-byte Ed25519 seed")
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

func keygen(args []string, stdout io.Writer) error {
	fset := flags("keygen", "[flags]", "Create an issuer key pair.", stdout)
	out := fset.String("out", "", "write the private key (base64 seed) to this file, mode 0600, instead of printing it")
	if _, err := config.Parse(fset, args, nil, noEnv); err != nil {
		return err
	}
	if fset.NArg() > 0 {
		return fmt.Errorf("keygen: unexpected argument %q", fset.Arg(0))
	}
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	seed := base64.StdEncoding.EncodeToString(key.Seed())
	if *out != "" {
		if err := os.WriteFile(*out, []byte(seed+"\n"), 0o600); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "private key written to %s\n", *out)
	} else {
		fmt.Fprintf(stdout, "private: %s\n", seed)
	}
	fmt.Fprintf(stdout, "public:  %s\n\ntrust it with FN_ISSUER_KEYS=%s\n", base64.StdEncoding.EncodeToString(pub), base64.StdEncoding.EncodeToString(pub))
	return nil
}

// tokenEnv are the variables of the token command's flags.
var tokenEnv = map[string]string{"key-file": "FN_ISSUER_KEY_FILE", "key": "FN_ISSUER_PRIVATE_KEY"}

func mintToken(args []string, getenv func(string) string, stdout io.Writer) error {
	fset := flags("token", "[flags]", "Mint a device token with the issuer key; -key-file and -key also read FN_ISSUER_KEY_FILE and FN_ISSUER_PRIVATE_KEY.", stdout)
	keyFileSetting, _ := config.Lookup("FN_ISSUER_KEY_FILE")
	household := fset.String("household", "home", "household (hh claim)")
	device := fset.String("device", "", "device (sub claim)")
	scope := fset.String("scope", token.ScopeDevice, "device or admin")
	ttl := fset.Duration("ttl", 24*time.Hour, "how long the token is valid")
	keyFile := fset.String("key-file", keyFileSetting.Default, "issuer private key file (env FN_ISSUER_KEY_FILE)")
	keyB64 := fset.String("key", "", "issuer private key as a base64 seed, instead of -key-file (env FN_ISSUER_PRIVATE_KEY)")
	if _, err := config.Parse(fset, args, getenv, func(f string) string { return tokenEnv[f] }); err != nil {
		return err
	}
	if fset.NArg() > 0 {
		return fmt.Errorf("token: unexpected argument %q", fset.Arg(0))
	}
	if *device == "" {
		return errors.New("token: -device is required")
	}
	var key ed25519.PrivateKey
	var err error
	if *keyB64 != "" {
		key, err = parseSeed(*keyB64)
	} else {
		key, err = readIssuerKey(*keyFile)
	}
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

func migrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := loadConfig("migrate", args, getenv, stdout)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, cfg, newLogger(cfg, stderr))
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "migrations applied")
	return st.Close()
}

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
