package cli

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/internal/webpush"
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

// cliIssuerKey returns the issuer private key a command that mints uses: from
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

// loadVAPID returns the relay's VAPID identity for Web Push: the key in
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
