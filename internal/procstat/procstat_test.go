package procstat

import (
	"os"
	"os/exec"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		stat  string
		state string
		ppid  int
		ok    bool
	}{
		{"123 (postgres) S 1 120 120 0 -1", "S", 1, true},
		{"124 (a) b) Z 123 120 120 0", "Z", 123, true},
		{"125 (x)", "", 0, false},
	} {
		state, ppid, ok := Parse(tc.stat)
		if state != tc.state || ppid != tc.ppid || ok != tc.ok {
			t.Errorf("Parse(%q) = %q %d %v, want %q %d %v", tc.stat, state, ppid, ok, tc.state, tc.ppid, tc.ok)
		}
	}
}

// TestChildrenAndAlive: a started child is listed among this process's
// children and is alive; killed, it is a zombie until reaped, still
// listed and not alive; reaped, it is gone.
func TestChildrenAndAlive(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if !slices.Contains(Children(os.Getpid()), pid) || !Alive(pid) {
		t.Errorf("child %d: listed %v, alive %v", pid, Children(os.Getpid()), Alive(pid))
	}
	_ = cmd.Process.Kill()
	// Wait for its exit without reaping it: a zombie.
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(Children(os.Getpid()), pid) || Alive(pid) {
		t.Errorf("zombie %d: listed %v, alive %v; want listed and not alive", pid, Children(os.Getpid()), Alive(pid))
	}
	_ = cmd.Wait()
	if slices.Contains(Children(os.Getpid()), pid) || Alive(pid) {
		t.Errorf("child %d still listed or alive after it was reaped", pid)
	}
	if !Alive(os.Getpid()) {
		t.Error("this process is not alive")
	}
}
