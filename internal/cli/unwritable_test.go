//go:build linux

package cli

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestUnwritableDatabase restores a backup the way a root shell does under
// a service that runs as another user: a copy owned by root, mode 0644,
// moved into place. The relay, running as nobody, starts and serves, but
// /ready answers 503 saying the store cannot be written, the log names the
// file, fn_store_ready is 0 (the alert RelayStoreNotReady watches it,
// deploy/prometheus/alerts_test.yaml) and sends get 503. Once the file is
// given to the relay's user, /ready passes and sends succeed without a
// restart, and nothing sent before the backup is lost.
func TestUnwritableDatabase(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs the relay as nobody, which takes root")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody:", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)

	// The test's own directory, open to nobody (t.TempDir is root's alone).
	dir, err := os.MkdirTemp("", "relay-unwritable-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	data := filepath.Join(dir, "data")
	for _, err := range []error{os.Chmod(dir, 0o755), os.Mkdir(data, 0o700), os.Chown(data, uid, gid)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "relay")
	copyTo(t, relayBin, bin, 0o755)
	db := filepath.Join(data, "relay.db")

	k := newKeyed(t, map[string]string{
		"FN_LISTEN": "127.0.0.1:0", "FN_METRICS_ADDR": "127.0.0.1:0",
		"FN_DATABASE_URL": "sqlite:" + db,
	})
	asNobody := func() *process {
		cmd := exec.Command(bin)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		return startCmd(t, cmd, k.vars)
	}
	phone, laptop := k.mint(t, "phone"), k.mint(t, "laptop")

	p := asNobody()
	base := "http://" + p.addr
	if code, body := request(t, "POST", base+"/v1/register", phone, ""); code != 200 {
		t.Fatalf("register: %d %s", code, body)
	}
	if code, body := request(t, "POST", base+"/v1/send", laptop, `{"id":"before","to":["phone"],"payload":"YQ=="}`); code != 202 {
		t.Fatalf("send before the backup: %d %s", code, body)
	}
	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}

	// The backup, copied and moved into place by root.
	copyTo(t, db, filepath.Join(dir, "backup.db"), 0o644)
	if err := os.Rename(filepath.Join(dir, "backup.db"), db); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{db + "-wal", db + "-shm"} {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}

	p = asNobody()
	base = "http://" + p.addr
	code, body := get(t, base+"/ready")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "cannot be written") {
		t.Fatalf("/ready with a database owned by root: %d %s", code, body)
	}
	if logs := p.logs(); !strings.Contains(logs, db+" cannot be written by this process (uid "+nobody.Uid+")") {
		t.Fatalf("the log does not name the file and the user:\n%s", logs)
	}
	waitMetric(t, p, "fn_store_ready", 0)
	if code, body := request(t, "POST", base+"/v1/send", laptop, `{"id":"refused","to":["phone"],"payload":"Yg=="}`); code != http.StatusServiceUnavailable {
		t.Fatalf("send into a database owned by root: %d %s", code, body)
	}

	if err := os.Chown(db, uid, gid); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, p, "fn_store_ready", 1)
	if code, body := get(t, base+"/ready"); code != http.StatusOK {
		t.Fatalf("/ready once the file is the relay's: %d %s", code, body)
	}
	if code, body := request(t, "POST", base+"/v1/send", laptop, `{"id":"after","to":["phone"],"payload":"Yw=="}`); code != 202 {
		t.Fatalf("send once the file is the relay's: %d %s", code, body)
	}
	code, b := request(t, "GET", base+"/v1/poll?cursor=0", phone, "")
	if code != 200 || !strings.Contains(string(b), `"id":"before"`) || !strings.Contains(string(b), `"id":"after"`) || strings.Contains(string(b), `"id":"refused"`) {
		t.Fatalf("poll after the restore: %d %s", code, b)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func copyTo(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}
