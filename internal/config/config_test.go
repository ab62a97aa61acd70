package config

import (
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func load(args []string, vars map[string]string) (Config, error) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return Load(fs, args, env(vars))
}

// TestPrecedence: a flag wins over its variable, which wins over the
// default.
func TestPrecedence(t *testing.T) {
	c, err := load([]string{"-max-wait-secs", "30"}, map[string]string{"FN_MAX_WAIT_SECS": "10", "FN_MAX_RECIPIENTS": "5"})
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxWait != 30*time.Second || c.MaxRecipients != 5 || c.PollBudgetBytes != Default().PollBudgetBytes {
		t.Fatalf("wait %v recipients %d budget %d", c.MaxWait, c.MaxRecipients, c.PollBudgetBytes)
	}
}

// TestBadValueNamesItsSource: one line naming the flag when the value came
// from a flag, the variable when it came from the environment.
func TestBadValueNamesItsSource(t *testing.T) {
	for _, tt := range []struct {
		args      []string
		vars      map[string]string
		want, not string
	}{
		{[]string{"-max-wait-secs", "soon"}, map[string]string{"FN_MAX_WAIT_SECS": "10"}, "-max-wait-secs", "FN_MAX_WAIT_SECS"},
		{nil, map[string]string{"FN_MAX_WAIT_SECS": "soon"}, `FN_MAX_WAIT_SECS="soon"`, "-max-wait-secs"},
		{[]string{"-database-url", "mysql://x"}, nil, "-database-url", "FN_DATABASE_URL"},
		{[]string{"-no-such-flag", "1"}, nil, "-no-such-flag", "\n"},
		{nil, map[string]string{"FN_RELAY_REPLICAS": "2"}, "FN_REDIS_URL", "\n"},
		{nil, map[string]string{"FN_CONSOLE": "yes please"}, "FN_CONSOLE", "\n"},
		{[]string{"-console", "true"}, map[string]string{"FN_ISSUER_KEYS": "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="}, "FN_CONSOLE", "\n"},
	} {
		_, err := load(tt.args, tt.vars)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), tt.not) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q %v: error %v, want one line naming %s and not %q", tt.args, tt.vars, err, tt.want, tt.not)
		}
	}
}

// TestHelp: -h writes the usage, with every setting, and says so.
func TestHelp(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var out strings.Builder
	fs.SetOutput(&out)
	if _, err := Load(fs, []string{"-h"}, env(nil)); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, s := range settings {
		if !strings.Contains(out.String(), "-"+s.Flag()+" ") || !strings.Contains(out.String(), s.Env) {
			t.Errorf("usage lacks %s", s.Env)
		}
	}
}

// TestParseAppliesEnvOnlyToFlagsLeftOut: the binding the loadtest shares.
func TestParseAppliesEnvOnlyToFlagsLeftOut(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	a, b := fs.Int("a", 1, ""), fs.Int("b", 1, "")
	vars := map[string]string{"X_A": "2", "X_B": "3"}
	applied, err := Parse(fs, []string{"-a", "4", "rest"}, env(vars), func(f string) string { return "X_" + strings.ToUpper(f) })
	if err != nil || *a != 4 || *b != 3 || !slices.Equal(applied, []string{"X_B=3"}) || fs.Arg(0) != "rest" {
		t.Fatalf("a %d b %d applied %q args %q err %v", *a, *b, applied, fs.Args(), err)
	}
}

func TestDatabaseURL(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Database
		ok   bool
	}{
		{"sqlite:data/relay.db", Database{Kind: SQLite, Path: "data/relay.db"}, true},
		{"sqlite:/var/lib/relay/relay.db", Database{Kind: SQLite, Path: "/var/lib/relay/relay.db"}, true},
		{"postgres://u@h/db?sslmode=disable", Database{Kind: Postgres, DSN: "postgres://u@h/db?sslmode=disable"}, true},
		{"postgresql://h/db", Database{Kind: Postgres, DSN: "postgresql://h/db"}, true},
		{"sqlite:", Database{}, false},
		{"mysql://h/db", Database{}, false},
		{"", Database{}, false},
	} {
		got, err := ParseDatabaseURL(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseDatabaseURL(%q) = %+v, %v", tt.in, got, err)
		}
		if tt.ok && got.URL() != tt.in {
			t.Errorf("URL() = %q, want %q", got.URL(), tt.in)
		}
	}
}

// TestSettingsTable: every setting has a flag, a meaning and a default its
// own parser accepts, and appears once.
func TestSettingsTable(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range Settings() {
		if seen[s.Env] || !strings.HasPrefix(s.Env, "FN_") || s.Usage == "" {
			t.Errorf("%s: duplicate, misnamed or undocumented", s.Env)
		}
		seen[s.Env] = true
		if err := s.Check(s.Default); err != nil {
			t.Errorf("%s: default %q refused: %v", s.Env, s.Default, err)
		}
		if got, ok := Lookup(s.Env); !ok || got.Env != s.Env {
			t.Errorf("Lookup(%s) = %v", s.Env, ok)
		}
		if !strings.Contains(Table(), "| `"+s.Env+"` | `-"+s.Flag()+"` |") {
			t.Errorf("Table() lacks %s", s.Env)
		}
	}
	if _, ok := Lookup("FN_NO_SUCH"); ok {
		t.Error("Lookup found FN_NO_SUCH")
	}
}

func TestParseTrustedProxies(t *testing.T) {
	ps, err := ParseTrustedProxies(" 10.0.0.0/8, 192.168.1.7 ,::1, ::ffff:172.16.0.0/108,")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.0/8", "192.168.1.7/32", "::1/128", "172.16.0.0/12"}
	if len(ps) != len(want) {
		t.Fatalf("got %v, want %v", ps, want)
	}
	for i := range want {
		if ps[i].String() != want[i] {
			t.Errorf("entry %d: %v, want %s", i, ps[i], want[i])
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "example.com", "10.0.0.1/8/8", "fe80::1%eth0", "::ffff:1.2.3.4/64"} {
		if _, err := ParseTrustedProxies(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestCORSOriginsSetting: an origin spelt as no browser sends it would
// never match, so it stops the relay at start.
func TestCORSOriginsSetting(t *testing.T) {
	for _, good := range []string{"", "*", "https://app.example", "http://127.0.0.1:5173, https://app.example", "http://[::1]:8080"} {
		if _, err := ParseCORSOrigins(good); err != nil {
			t.Errorf("%q refused: %v", good, err)
		}
	}
	for _, bad := range []string{"https://app.example/", "https://app.example/x", "HTTPS://App.example", "https://app.example:443",
		"http://app.example:80", "ftp://app.example", "app.example", "*, https://app.example", "https://u@app.example", "https://app.example?"} {
		if _, err := ParseCORSOrigins(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	env := func(k string) string {
		if k == "FN_CORS_ORIGINS" {
			return "https://app.example/"
		}
		return ""
	}
	if _, err := FromEnv(env); err == nil || !strings.Contains(err.Error(), "FN_CORS_ORIGINS") {
		t.Errorf("a bad FN_CORS_ORIGINS: %v, want an error naming it", err)
	}
}

// TestPairingSettings: the pairing lifetimes keep to their ranges, the
// defaults are the protocol's, and FN_PUBLIC_URL must be a plain http or
// https base (its trailing slash dropped, as links append to it).
func TestPairingSettings(t *testing.T) {
	c, err := load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.InviteTTL != 10*time.Minute || c.AccessTokenTTL != time.Hour || c.RenewalTTL != 90*24*time.Hour ||
		c.PublicURL != "" || c.PairRatePerAddress != 10 || c.PairRate != 100 {
		t.Errorf("defaults %v %v %v %q %d %d", c.InviteTTL, c.AccessTokenTTL, c.RenewalTTL, c.PublicURL, c.PairRatePerAddress, c.PairRate)
	}
	for _, bad := range []map[string]string{
		{"FN_INVITE_TTL": "59s"}, {"FN_INVITE_TTL": "25h"}, {"FN_ACCESS_TOKEN_TTL": "0s"}, {"FN_ACCESS_TOKEN_TTL": "24h1s"},
		{"FN_RENEWAL_TTL": "59m"}, {"FN_RENEWAL_TTL": "8761h"}, {"FN_PAIR_RATE": "0"}, {"FN_PAIR_RATE_PER_ADDRESS": "-1"},
		{"FN_PUBLIC_URL": "relay.example"}, {"FN_PUBLIC_URL": "ftp://relay.example"}, {"FN_PUBLIC_URL": "https://u:p@relay.example"},
		{"FN_PUBLIC_URL": "https://relay.example/?x=1"}, {"FN_PUBLIC_URL": "https://relay.example/#x"}, {"FN_PUBLIC_URL": "https://"},
	} {
		if _, err := load(nil, bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	c, err = load(nil, map[string]string{"FN_PUBLIC_URL": "https://relay.example/base/", "FN_INVITE_TTL": "24h", "FN_ACCESS_TOKEN_TTL": "1m"})
	if err != nil {
		t.Fatal(err)
	}
	if c.PublicURL != "https://relay.example/base" || c.InviteTTL != 24*time.Hour || c.AccessTokenTTL != time.Minute {
		t.Errorf("got %q %v %v", c.PublicURL, c.InviteTTL, c.AccessTokenTTL)
	}
}

// TestFlagErrorMarksTheCommandLine: a mistake on the command line is a
// *FlagError, a bad variable is not, so that commands can tell the two
// apart (exit 2 and 1).
func TestFlagErrorMarksTheCommandLine(t *testing.T) {
	var fe *FlagError
	for _, args := range [][]string{{"-no-such-flag"}, {"-max-wait-secs", "soon"}} {
		if _, err := load(args, nil); !errors.As(err, &fe) {
			t.Errorf("%q: %v is not a *FlagError", args, err)
		}
	}
	if _, err := load(nil, map[string]string{"FN_MAX_WAIT_SECS": "soon"}); err == nil || errors.As(err, &fe) {
		t.Errorf("a bad variable: %v, want an error that is not a *FlagError", err)
	}
}

// TestLoadOnly: only the named settings are flags and read from the
// environment; the others keep their defaults.
func TestLoadOnly(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	vars := map[string]string{"FN_LOG_LEVEL": "debug", "FN_MAX_WAIT_SECS": "soon", "FN_RELAY_REPLICAS": "2"}
	c, err := LoadOnly(fs, []string{"-database-url", "sqlite:x.db"}, env(vars), "FN_DATABASE_URL", "FN_LOG_LEVEL")
	if err != nil || c.DatabaseURL != "sqlite:x.db" || c.LogLevel != "debug" || c.MaxWait != Default().MaxWait || c.RelayReplicas != 1 {
		t.Fatalf("%+v, %v", c, err)
	}
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n != 2 {
		t.Errorf("%d flags, want 2", n)
	}
	fs = flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if _, err := LoadOnly(fs, []string{"-max-wait-secs", "5"}, env(nil), "FN_DATABASE_URL"); err == nil {
		t.Error("a setting left out is still a flag")
	}
}
