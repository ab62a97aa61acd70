// Package procstat is the module's one reader of Linux's /proc: a
// process's state, parent, start time, CPU time, memory, limits, cgroups,
// working directory and arguments; the machine's processes, mounts, CPU
// model, kernel settings, TCP memory and System V shared memory.
// github.com/prometheus/procfs parses the files, all but
// /proc/sysvipc/shm, which it does not read.
package procstat

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/prometheus/procfs"
)

// root is where /proc is read; tests point it at a fixed sample.
var root = procfs.DefaultMountPoint

func machine() (procfs.FS, error) {
	return procfs.NewFS(root)
}

// open is process pid's directory.
func open(pid int) (procfs.Proc, error) {
	fs, err := machine()
	if err != nil {
		return procfs.Proc{}, err
	}
	return fs.Proc(pid)
}

// stat reads /proc/<pid>/stat, "pid (comm) state ppid ...", where comm
// may hold spaces and parentheses.
func stat(pid int) (procfs.ProcStat, error) {
	p, err := open(pid)
	if err != nil {
		return procfs.ProcStat{}, err
	}
	return p.Stat()
}

// StartTime is /proc/<pid>/stat's 22nd field, when the process started,
// which a later process with the same pid does not share; "" when pid
// does not exist or /proc cannot tell.
func StartTime(pid int) string {
	s, err := stat(pid)
	if err != nil {
		return ""
	}
	return strconv.FormatUint(s.Starttime, 10)
}

// userHZ is the unit of /proc/<pid>/stat's times: 100 on every Linux, as
// procfs assumes too; Go has no sysconf to ask.
const userHZ = 100

// CPUTime returns process pid's user plus system CPU time.
func CPUTime(pid int) (time.Duration, error) {
	s, err := stat(pid)
	if err != nil {
		return 0, err
	}
	// From the ticks, exactly: procfs's CPUTime is float seconds.
	return time.Duration(s.UTime+s.STime) * time.Second / userHZ, nil
}

// PeakRSS returns process pid's peak resident set (VmHWM) in bytes.
func PeakRSS(pid int) (int64, error) {
	return memory(pid, "VmHWM", func(s procfs.ProcStatus) uint64 { return s.VmHWM })
}

// RSS returns process pid's resident set (VmRSS) in bytes.
func RSS(pid int) (int64, error) {
	return memory(pid, "VmRSS", func(s procfs.ProcStatus) uint64 { return s.VmRSS })
}

func memory(pid int, name string, field func(procfs.ProcStatus) uint64) (int64, error) {
	p, err := open(pid)
	if err != nil {
		return 0, err
	}
	s, err := p.NewStatus()
	if err != nil {
		return 0, err
	}
	// procfs reads a missing line as 0. A process without memory (a
	// zombie) has no such line, and one with memory never shows 0.
	n := field(s)
	if n == 0 {
		return 0, fmt.Errorf("/proc/%d/status: no %s", pid, name)
	}
	return int64(n), nil
}

// OpenFileLimit returns process pid's soft limit on open files.
func OpenFileLimit(pid int) (uint64, error) {
	p, err := open(pid)
	if err != nil {
		return 0, err
	}
	l, err := p.Limits()
	return l.OpenFiles, err
}

// AddressSpaceLimit returns process pid's soft limit on address space in
// bytes; -1 when unlimited.
func AddressSpaceLimit(pid int) (int64, error) {
	p, err := open(pid)
	if err != nil {
		return 0, err
	}
	l, err := p.Limits()
	if err != nil {
		return 0, err
	}
	if l.AddressSpace == math.MaxUint64 { // procfs's "unlimited"
		return -1, nil
	}
	return int64(l.AddressSpace), nil
}

// Cgroup is a line of /proc/<pid>/cgroup: the hierarchy (0 and no
// controllers for cgroup v2's unified one), its controllers, and the
// process's cgroup there.
type Cgroup = procfs.Cgroup

// Cgroups returns the cgroups process pid is in, one per hierarchy.
func Cgroups(pid int) ([]Cgroup, error) {
	p, err := open(pid)
	if err != nil {
		return nil, err
	}
	return p.Cgroups()
}

// Cwd returns process pid's working directory; "" when it has none (a
// zombie).
func Cwd(pid int) (string, error) {
	p, err := open(pid)
	if err != nil {
		return "", err
	}
	return p.Cwd()
}

// Args returns process pid's command line; none for a zombie or a kernel
// thread.
func Args(pid int) ([]string, error) {
	p, err := open(pid)
	if err != nil {
		return nil, err
	}
	return p.CmdLine()
}
