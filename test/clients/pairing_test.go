package clients

import (
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/pairtest"
)

// TestTypeScriptPairing runs the TypeScript client's pairing and renewal
// tests (typescript/src/test/pairing.contract.ts) against a real relay on
// a fake clock behind the pairing contract's test server, 2-minute access
// tokens, pair and renew answered by the test's server and by the
// relay's own endpoints: the test's Node process moves the relay's clock and its own
// together, so ten minutes of tokens take seconds.
func TestTypeScriptPairing(t *testing.T) {
	buildTypeScript(t)
	for _, mode := range pairtest.Modes() {
		t.Run(string(mode), func(t *testing.T) {
			cr := pairtest.NewContractMode(t, mode, pairtest.NewClock(), 2*time.Minute)
			cmd := exec.Command("node", "--test", "--test-concurrency=1", "--test-timeout=120000", "dist/test/pairing.contract.js")
			cmd.Dir = tsDir
			cmd.Env = append(cleanEnv(), "PAIRTEST_URL="+cr.URL)
			dieWithTest(cmd)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("node --test: %v\n%s", err, out)
			}
			if !regexp.MustCompile(`(?m)^# pass 12$`).Match(out) || !regexp.MustCompile(`(?m)^# fail 0$`).Match(out) {
				t.Fatalf("want 12 tests passed:\n%s", out)
			}
		})
	}
}
