package main

import (
	"crypto/ecdsa"
	"log/slog"

	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/flamenet/relay/config"
	"github.com/flamenet/relay/internal/webpush"
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

// cliIssuerKey is the issuer private key a command that mints uses: from
// its -issuer-key-file flag when given, else from
// FN_ISSUER_PRIVATE_KEY (a base64 seed) when set, else from
// FN_ISSUER_KEY_FILE, else from keyFile, the flag's default. from says
// where it came from, for messages.
func cliIssuerKey(fset *flag.FlagSet, keyFile string, getenv func(string) string) (key ed25519.PrivateKey, from string, err error) {
	keyFileGiven := false
	fset.Visit(func(f *flag.Flag) { keyFileGiven = keyFileGiven || f.Name == "issuer-key-file" })
	switch seed, file := getenv("FN_ISSUER_PRIVATE_KEY"), getenv("FN_ISSUER_KEY_FILE"); {
	case keyFileGiven:
		from = keyFile
	case seed != "":
		key, err = parseSeed(strings.TrimSpace(seed))
		return key, "FN_ISSUER_PRIVATE_KEY", err
	case file != "":
		from = file
	default:
		from = keyFile
	}
	key, err = readIssuerKey(from)
	return key, from, err
}

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

func migrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := loadConfig("migrate", "Applies the store's migrations to FN_DATABASE_URL's database and exits.", args, getenv, stdout,
		"FN_DATABASE_URL", "FN_SQLITE_SYNCHRONOUS", "FN_STORE_LOCK_TIMEOUT", "FN_PG_MAX_CONNECTIONS_PER_LOOP", "FN_LOG_LEVEL", "FN_LOG_FORMAT")
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

// loadVAPID is the relay's VAPID identity for Web Push: the key in
// FN_VAPID_PRIVATE_KEY, or in FN_VAPID_KEY_FILE (created on first start,
// mode 0600), with FN_VAPID_SUBJECT, or FN_PUBLIC_URL when it is https, as
// its contact. Without a contact there is no webpush kind (and
// UnifiedPush's Web Push goes unsigned): push services want one.
func loadVAPID(cfg config.Config, log *slog.Logger) (*webpush.VAPID, error) {
	subject := cfg.VAPIDSubject
	if subject == "" && strings.HasPrefix(cfg.PublicURL, "https://") {
		subject = cfg.PublicURL
	}
	if subject == "" {
		log.Info("Web Push is off: set FN_VAPID_SUBJECT (mailto: or https:) or an https FN_PUBLIC_URL for push services to reach you by")
		return nil, nil
	}
	var key *ecdsa.PrivateKey
	switch {
	case cfg.VAPIDPrivateKey != "":
		k, err := webpush.ParseVAPIDKey(cfg.VAPIDPrivateKey)
		if err != nil {
			return nil, fmt.Errorf("FN_VAPID_PRIVATE_KEY: %w", err)
		}
		key = k
	default:
		k, created, err := loadOrCreateVAPIDKey(cfg.VAPIDKeyFile)
		if err != nil {
			return nil, fmt.Errorf("FN_VAPID_KEY_FILE: %w", err)
		}
		if created {
			log.Info("created a VAPID key", "file", cfg.VAPIDKeyFile)
		}
		key = k
	}
	v, err := webpush.NewVAPID(key, subject)
	if err != nil {
		return nil, fmt.Errorf("FN_VAPID_SUBJECT: %w", err)
	}
	return v, nil
}

// loadOrCreateVAPIDKey reads the VAPID key in path, or creates one (mode
// 0600) when the file does not exist.
func loadOrCreateVAPIDKey(path string) (key *ecdsa.PrivateKey, created bool, err error) {
	b, err := os.ReadFile(path)
	if err == nil {
		key, err = webpush.ParseVAPIDKey(string(b))
		return key, false, err
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, err
	}
	if key, err = webpush.GenerateVAPIDKey(); err != nil {
		return nil, false, err
	}
	s, err := webpush.FormatVAPIDKey(key)
	if err != nil {
		return nil, false, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, false, err
	}
	if _, err := fmt.Fprintln(f, s); err != nil {
		f.Close()
		return nil, false, err
	}
	return key, true, f.Close()
}
