package cli

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/flamenet/relay/internal/servicetest"
)

// TestReadmePostgresShape: the README's "One relay on Postgres" row, its
// settings and nothing else, gives a relay that pairs a device by
// invitation, as the SQLite shape does. Seen red when the row told a
// single Postgres relay to set FN_ISSUER_KEYS, which turns pairing off.
func TestReadmePostgresShape(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^\| One relay on Postgres \|(.*)\|$`).FindStringSubmatch(string(b))
	if row == nil {
		t.Fatal(`the README's shapes table has no "One relay on Postgres" row`)
	}
	dir := t.TempDir()
	vars := map[string]string{"FN_LISTEN": "127.0.0.1:0", "FN_ISSUER_KEY_FILE": filepath.Join(dir, "issuer.key")}
	// What the row says to set, in backquotes as NAME=value; its
	// placeholders stand for this test's database and a real key.
	for _, m := range regexp.MustCompile("`(FN_[A-Z_]+)=([^`]*)`").FindAllStringSubmatch(row[1], -1) {
		switch name := m[1]; name {
		case "FN_DATABASE_URL":
			vars[name] = servicetest.PostgresDatabase(t)
		case "FN_ISSUER_KEYS":
			vars[name] = newSeed(t).public()
		default:
			vars[name] = m[2]
		}
	}
	if !strings.HasPrefix(vars["FN_DATABASE_URL"], "postgres") {
		t.Fatalf("the row sets no Postgres FN_DATABASE_URL: %s", row[1])
	}
	p := start(t, vars)
	base := "http://" + p.addr
	var stdout, stderr bytes.Buffer
	err = run(context.Background(), []string{"invite", "-household", "home", "-device", "phone", "-url", base, "-issuer-key-file", vars["FN_ISSUER_KEY_FILE"]},
		noEnv, &stdout, &stderr)
	if err != nil {
		t.Fatalf("invite on the row's settings: %v\n%s", err, stderr.String())
	}
	code := regexp.MustCompile(`(?m)^  code: +(\S+)$`).FindStringSubmatch(stdout.String())
	if code == nil {
		t.Fatalf("no code in:\n%s", stdout.String())
	}
	if status, body := request(t, "POST", base+"/v1/pair", "", `{"code":"`+code[1]+`"}`); status != http.StatusOK {
		t.Fatalf("pairing: %d %s", status, body)
	}
}
