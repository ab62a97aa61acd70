package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBackupUnderLoad: relay backup, taken while sends arrive at 100/s,
// is a copy that relay restore accepts (once the relay is stopped: while
// it runs, restore refuses) and that holds every envelope answered 202
// before the backup began.
func TestBackupUnderLoad(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "relay.db")
	k := newKeyed(t, map[string]string{"FN_LISTEN": "127.0.0.1:0", "FN_DATABASE_URL": "sqlite:" + db})
	dbEnv := env(map[string]string{"FN_DATABASE_URL": "sqlite:" + db})
	p := start(t, k.vars)
	base := "http://" + p.addr
	phone, laptop := k.mint(t, "phone"), k.mint(t, "laptop")
	if code, body := request(t, "POST", base+"/v1/register", phone, ""); code != 200 {
		t.Fatalf("register: %d %s", code, body)
	}

	type accepted struct {
		id string
		at time.Time
	}
	var (
		mu   sync.Mutex
		sent []accepted
	)
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(sent) }
	ctx, stopLoad := context.WithCancel(context.Background())
	loadDone := make(chan error, 1)
	go func() {
		tick := time.NewTicker(10 * time.Millisecond) // 100 sends/s
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				loadDone <- nil
				return
			case <-tick.C:
			}
			id := fmt.Sprintf("e%05d", i)
			req, _ := http.NewRequest("POST", base+"/v1/send", strings.NewReader(`{"id":"`+id+`","to":["phone"],"payload":"eA=="}`))
			req.Header.Set("Authorization", "Bearer "+laptop)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				loadDone <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted {
				loadDone <- fmt.Errorf("send %s: %d", id, resp.StatusCode)
				return
			}
			mu.Lock()
			sent = append(sent, accepted{id, time.Now()})
			mu.Unlock()
		}
	}()
	waitFor(t, "50 sends accepted", func() bool { return count() >= 50 })

	began := time.Now()
	backup := filepath.Join(dir, "backup.db")
	if err := run(context.Background(), []string{"backup", backup}, dbEnv, io.Discard, io.Discard); err != nil {
		t.Fatalf("backup under load: %v", err)
	}
	mu.Lock()
	var before []string
	for _, a := range sent {
		if a.at.Before(began) {
			before = append(before, a.id)
		}
	}
	mu.Unlock()
	after := count()
	waitFor(t, "sends after the backup", func() bool { return count() >= after+20 })
	stopLoad()
	if err := <-loadDone; err != nil {
		t.Fatal(err)
	}

	var out strings.Builder
	if err := run(context.Background(), []string{"restore", backup}, dbEnv, &out, &out); err == nil || !strings.Contains(err.Error(), "stop the relay first") {
		t.Fatalf("restore while the relay runs = %v, want a refusal", err)
	}
	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"restore", backup}, dbEnv, &out, &out); err != nil {
		t.Fatalf("restore: %v\n%s", err, out.String())
	}

	p = start(t, k.vars)
	base = "http://" + p.addr
	code, b := request(t, "GET", base+"/v1/poll?cursor=0&limit=1000", phone, "")
	if code != 200 {
		t.Fatalf("poll after the restore: %d %s", code, b)
	}
	for _, id := range before {
		if !strings.Contains(string(b), `"id":"`+id+`"`) {
			t.Fatalf("envelope %s, accepted before the backup began, is not in the restored database (%d accepted before it)", id, len(before))
		}
	}
	if strings.Contains(string(b), fmt.Sprintf(`"id":"e%05d"`, count()-1)) {
		t.Errorf("the last envelope, sent well after the backup, is in the restored database: was the live one restored?")
	}
}

// waitFor polls cond, for what another goroutine or process does.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of another goroutine's progress
	}
}

// TestBackupRelativePath: relay backup and relay restore with the default
// database, data/relay.db below the working directory as go run . keeps
// it, and spelt ./data/relay.db, each with a relative FILE. SQLite read
// the first segment of a relative path as the URI's authority: "invalid
// uri authority: data".
func TestBackupRelativePath(t *testing.T) {
	t.Chdir(t.TempDir())
	ctx := context.Background()
	var out strings.Builder
	if err := run(ctx, []string{"migrate"}, env(nil), &out, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out.String())
	}
	for _, c := range []struct{ database, file string }{
		{"", "backup.db"},
		{"sqlite:./data/relay.db", "./backup2.db"},
	} {
		vars := env(map[string]string{"FN_DATABASE_URL": c.database})
		if c.database == "" {
			vars = env(nil) // the default
		}
		out.Reset()
		if err := run(ctx, []string{"backup", c.file}, vars, &out, &out); err != nil {
			t.Errorf("backup %s of %q: %v", c.file, c.database, err)
			continue
		}
		if fi, err := os.Stat(c.file); err != nil || fi.Size() == 0 {
			t.Errorf("backup %s of %q: the copy: %v %v", c.file, c.database, fi, err)
		}
		if err := run(ctx, []string{"restore", c.file}, vars, &out, &out); err != nil {
			t.Errorf("restore %s to %q: %v", c.file, c.database, err)
		}
	}
}
