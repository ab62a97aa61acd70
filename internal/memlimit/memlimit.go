// Package memlimit finds the memory limit of the container (cgroup) a
// process runs in, so that the Go runtime can be given a memory target
// below it: with one, the garbage collector works harder as the limit
// nears, instead of letting the heap grow to twice what is live and the
// kernel end the process.
package memlimit

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// unlimited: cgroup v1 reports no limit as a huge number.
const unlimited = 1 << 60

// Limit returns the memory limit in bytes of the cgroup this process is
// in, or 0 when there is none (or it cannot be read).
func Limit() int64 { return limit("/proc/self/cgroup", "/sys/fs/cgroup") }

// limit reads the process's cgroups from procCgroup and their files under
// root: cgroup v2's memory.max, or v1's memory.limit_in_bytes. A limit set
// on the process's own group wins; else the hierarchy's root (a container
// whose cgroup namespace makes its group the root).
func limit(procCgroup, root string) int64 {
	f, err := os.Open(procCgroup)
	if err != nil {
		return 0
	}
	defer f.Close()
	var candidates []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "": // v2
			candidates = append(candidates,
				filepath.Join(root, parts[2], "memory.max"),
				filepath.Join(root, "unified", parts[2], "memory.max"),
				filepath.Join(root, "memory.max"))
		case hasController(parts[1], "memory"): // v1
			candidates = append(candidates,
				filepath.Join(root, "memory", parts[2], "memory.limit_in_bytes"),
				filepath.Join(root, "memory", "memory.limit_in_bytes"))
		}
	}
	for _, c := range candidates {
		b, err := os.ReadFile(c)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n >= unlimited {
			continue
		}
		return n
	}
	return 0
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}
