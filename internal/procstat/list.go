package procstat

import (
	"os"
	"path/filepath"
	"strconv"
)

// Proc is one process as its /proc/<pid>/stat line shows it.
type Proc struct {
	PID, PPID int
	State     string
}

// List reads every process's stat line; processes that end meanwhile, or
// whose line does not parse, are left out.
func List() []Proc {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []Proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := read(pid); ok {
			out = append(out, p)
		}
	}
	return out
}

// Children lists the processes whose parent is pid.
func Children(pid int) []int {
	var out []int
	for _, p := range List() {
		if p.PPID == pid {
			out = append(out, p.PID)
		}
	}
	return out
}

// Alive reports whether process pid exists and is not a zombie: a zombie
// holds no port, no memory and no shared memory.
func Alive(pid int) bool {
	p, ok := read(pid)
	return ok && p.State != "Z" && p.State != "X"
}

func read(pid int) (Proc, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return Proc{}, false
	}
	state, ppid, ok := Parse(string(b))
	return Proc{PID: pid, PPID: ppid, State: state}, ok
}
