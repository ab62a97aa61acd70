package stack

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestKeyedInt(t *testing.T) {
	p := filepath.Join(t.TempDir(), "memory.oom_control")
	if err := os.WriteFile(p, []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := keyedInt(p, "oom_kill"); err != nil || n != 2 {
		t.Errorf("oom_kill = %d, %v", n, err)
	}
	if _, err := keyedInt(p, "oom_group_kill"); err == nil {
		t.Error("a missing key read as 0")
	}
}

// TestOwnCgroupDir: where this machine has a memory hierarchy, the
// directory found for this process exists and holds this process.
func TestOwnCgroupDir(t *testing.T) {
	found := false
	for _, v := range []int{1, 2} {
		dir, err := ownCgroupDir(v)
		if err != nil {
			t.Logf("cgroup v%d: %v", v, err)
			continue
		}
		found = true
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			t.Errorf("cgroup v%d dir %s: %v", v, dir, err)
			continue
		}
		if !slices.Contains(strings.Fields(string(b)), strconv.Itoa(os.Getpid())) {
			t.Errorf("cgroup v%d dir %s does not list pid %d", v, dir, os.Getpid())
		}
	}
	if !found {
		t.Skip("no cgroup hierarchy here")
	}
}
