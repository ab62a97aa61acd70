package procstat

import (
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
)

// Proc is one process as its /proc/<pid>/stat line shows it.
type Proc struct {
	PID, PPID int
	State     string
}

// allProcs returns every process /proc lists now; none when it cannot be
// read.
func allProcs() procfs.Procs {
	fs, err := machine()
	if err != nil {
		return nil
	}
	all, err := fs.AllProcs()
	if err != nil {
		return nil
	}
	return all
}

// List reads every process's stat line; processes that end meanwhile, or
// whose line does not parse, are left out.
func List() []Proc {
	all := allProcs()
	var out []Proc
	for _, p := range all {
		if s, err := p.Stat(); err == nil {
			out = append(out, Proc{PID: p.PID, PPID: s.PPID, State: s.State})
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
	s, err := stat(pid)
	return err == nil && s.State != "Z" && s.State != "X"
}

// Command is a process and its command line.
type Command struct {
	PID  int
	Args []string
}

// String is the pid and the command line, as a test's message shows them.
func (c Command) String() string {
	return strconv.Itoa(c.PID) + ": " + strings.Join(c.Args, " ")
}

// WithArg lists the processes one of whose arguments holds s. A zombie
// has no arguments, so every one listed is alive.
func WithArg(s string) []Command {
	all := allProcs()
	var out []Command
	for _, p := range all {
		args, err := p.CmdLine()
		if err == nil && slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, s) }) {
			out = append(out, Command{PID: p.PID, Args: args})
		}
	}
	return out
}
