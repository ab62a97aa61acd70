// Package procstat reads the lines of Linux's /proc/<pid>/stat that the
// test harnesses need to find and stop the processes they started: a
// process's state and parent, its children, whether it lives.
package procstat

import (
	"strconv"
	"strings"
)

// Parse reads the state and parent from a /proc/<pid>/stat line:
// "pid (comm) state ppid ...", where comm may hold anything.
func Parse(stat string) (state string, ppid int, ok bool) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return "", 0, false
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 2 {
		return "", 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return f[0], ppid, err == nil
}
