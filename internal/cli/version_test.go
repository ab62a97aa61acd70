package cli

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/flamenet/relay/internal/servicetest"
)

// TestVersion: a binary stamped as scripts/release.sh stamps it says its
// version and commit in `relay version` and in fn_build_info; an unstamped
// one says devel rather than nothing.
func TestVersion(t *testing.T) {
	const ver, rev = "v9.8.7-test", "0123456789abcdef0123456789abcdef01234567"
	bin, err := servicetest.BuildRelay(t.TempDir(), "-ldflags", "-X main.version="+ver+" -X main.revision="+rev)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "version").Output()
	if want := "relay " + ver + " (rev 0123456789ab) " + runtime.Version() + "\n"; err != nil || string(out) != want {
		t.Fatalf("version: %q %v, want %q", out, err, want)
	}
	out, err = exec.Command(relayBin, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "relay devel (") {
		t.Fatalf("unstamped version: %q %v, want relay devel (...)", out, err)
	}

	k := newKeyed(t, map[string]string{
		"FN_LISTEN": "127.0.0.1:0", "FN_METRICS_ADDR": "127.0.0.1:0",
		"FN_DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "relay.db"),
	})
	p := startCmd(t, exec.Command(bin), k.vars)
	series := `fn_build_info{go_version="` + runtime.Version() + `",revision="` + rev + `",version="` + ver + `"}`
	if got := p.metric(t, series); got != 1 {
		t.Fatalf("%s = %v, want 1", series, got)
	}
	if !strings.Contains(p.logs(), "version="+ver) {
		t.Fatalf("the serving line does not name the version:\n%s", p.logs())
	}
	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestBuildString: what `relay version` prints for each kind of build.
func TestBuildString(t *testing.T) {
	gov := " " + runtime.Version()
	for _, tt := range []struct {
		b    build
		want string
	}{
		{build{Version: "v1.2.3"}, "v1.2.3" + gov},
		{build{Version: "v1.2.3", Revision: "abcdef0123456789"}, "v1.2.3 (rev abcdef012345)" + gov},
		{build{Version: "devel", Revision: "abc1234", Modified: true}, "devel (rev abc1234, modified)" + gov},
		{build{Version: "devel"}, "devel (no commit recorded: go run, or a build outside a git checkout)" + gov},
	} {
		if got := tt.b.String(); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.b, got, tt.want)
		}
	}
}
