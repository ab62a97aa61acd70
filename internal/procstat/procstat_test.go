package procstat

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
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

// TestStartTime: a process's start time is read from its stat line (field
// 22), also when its command name holds spaces and a ")", and it stays the
// same while the process runs, as the fields around it do not.
func TestStartTime(t *testing.T) {
	var fields []string
	for i := 3; i <= 30; i++ {
		fields = append(fields, fmt.Sprint(1000+i))
	}
	for _, name := range []string{"(go)", "(a b) c)"} {
		line := "42 " + name + " " + strings.Join(fields, " ") + "\n"
		if got := startTime(line); got != "1022" {
			t.Errorf("%q: start time %q, want 1022", line, got)
		}
	}
	read := func() string {
		st := StartTime(os.Getpid())
		if st == "" {
			t.Skip("no /proc")
		}
		return st
	}
	first := read()
	for i := 0; i < 1e7; i++ { // some CPU time, which moves fields 14 and 15
		_ = i * i
	}
	if again := read(); first == "" || again != first {
		t.Errorf("start time %q, then %q", first, again)
	}
}
