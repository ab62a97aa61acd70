package procstat

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// StartTime is /proc/<pid>/stat's 22nd field, when the process started,
// which a later process with the same pid does not share; "" when pid
// does not exist or /proc cannot tell.
func StartTime(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return ""
	}
	return startTime(string(b))
}

// startTime reads the start time from a stat line. The command name
// (field 2) is in parentheses and may hold spaces; the fields around the
// start time (state, CPU times) change as the process runs.
func startTime(stat string) string {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(stat[i+1:]) // from field 3 on
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

func read(pid int) (Proc, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return Proc{}, false
	}
	state, ppid, ok := Parse(string(b))
	return Proc{PID: pid, PPID: ppid, State: state}, ok
}
