package conformance

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/servicetest"
	"golang.org/x/sys/unix"
)

// TestCursorAfterLine: the cursor is saved only once the envelope's line is
// written. The listener's stdout is a pipe of one page that the test does
// not read at first, so writing a longer line blocks half-way; while it is
// blocked, the cursor file must not name the envelope yet (a listener
// killed then would otherwise never print it).
func TestCursorAfterLine(t *testing.T) {
	forEach(t, func(t *testing.T, im impl) {
		r := startRelay(t)
		r.register("phone")
		cursor := filepath.Join(t.TempDir(), "cursor")

		rd, wr, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer rd.Close()
		if _, err := unix.FcntlInt(wr.Fd(), unix.F_SETPIPE_SZ, 4096); err != nil {
			t.Skipf("cannot shrink a pipe: %v", err)
		}
		argv := append(im.argv(t), "listen", "-url", r.url(), "-token", r.token("phone"), "-wait", "5", "-cursor-file", cursor, "-count", "1")
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = cliEnv()
		cmd.Stdout = wr
		var stderr servicetest.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wr.Close()
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				cmd.Process.Kill()
				cmd.Wait()
			}
		})

		payload := strings.Repeat("x", 6000) // a line of about 8 KB
		im.mustSend(t, r, "laptop", "phone", "big", payload)
		waitFor(t, 20*time.Second, "the listener to fill its stdout pipe", func() bool {
			n, err := unix.IoctlGetInt(int(rd.Fd()), unix.TIOCINQ)
			return err == nil && n >= 4096
		})
		if got := readCursor(cursor); got >= 1 {
			t.Fatalf("cursor file holds %d while the envelope's line is still being written", got)
		}

		sc := bufio.NewScanner(rd)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		if !sc.Scan() {
			t.Fatalf("no line: %v; stderr %s", sc.Err(), stderr.String())
		}
		var ln line
		if err := json.Unmarshal(sc.Bytes(), &ln); err != nil || ln.ID != "big" || ln.Seq != 1 {
			t.Fatalf("line %q... (%v)", sc.Text()[:80], err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("listen -count 1: %v; stderr %s", err, stderr.String())
		}
		if got := readCursor(cursor); got != 1 {
			t.Fatalf("cursor file holds %d after the line, want 1", got)
		}
	})
}
