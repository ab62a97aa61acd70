package procstat

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
)

// CPUModel returns the first CPU's model name; "" when /proc/cpuinfo does
// not say.
func CPUModel() string {
	fs, err := machine()
	if err != nil {
		return ""
	}
	cpus, err := fs.CPUInfo()
	if err != nil || len(cpus) == 0 {
		return ""
	}
	return strings.TrimSpace(cpus[0].ModelName)
}

// Sysctl returns a kernel setting under /proc/sys, named by its path
// ("kernel/osrelease"), its fields joined by single spaces.
func Sysctl(name string) (string, error) {
	fs, err := machine()
	if err != nil {
		return "", err
	}
	f, err := fs.SysctlStrings(name)
	return strings.Join(f, " "), err
}

// SysctlInts returns the integers of a kernel setting under /proc/sys,
// such as net/ipv4/ip_local_port_range's two.
func SysctlInts(name string) ([]int, error) {
	fs, err := machine()
	if err != nil {
		return nil, err
	}
	return fs.SysctlInts(name)
}

// TCPMemory returns the kernel's TCP buffer memory now, in bytes: the
// "TCP: ... mem <pages>" of /proc/net/sockstat.
func TCPMemory() (int64, error) {
	fs, err := machine()
	if err != nil {
		return 0, err
	}
	s, err := fs.NetSockstat()
	if err != nil {
		return 0, err
	}
	for _, p := range s.Protocols {
		if p.Protocol == "TCP" && p.Mem != nil {
			return int64(*p.Mem) * int64(os.Getpagesize()), nil
		}
	}
	return 0, errors.New("/proc/net/sockstat: no TCP mem")
}

// Mount is a line of /proc/self/mountinfo.
type Mount = procfs.MountInfo

// Mounts returns this process's mounts, with the octal escapes of their
// paths (\040 for a space) undone, which procfs leaves in.
func Mounts() ([]*Mount, error) {
	fs, err := machine()
	if err != nil {
		return nil, err
	}
	ms, err := fs.GetMounts()
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		m.MountPoint, m.Root = unescape(m.MountPoint), unescape(m.Root)
	}
	return ms, nil
}

// unescape undoes mountinfo's octal escapes.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Segment is a System V shared memory segment.
type Segment struct {
	ID       int // shmid
	Creator  int // the pid that made it
	Attached int // how many processes have it attached now
}

// SharedMemory lists the System V shared memory segments, from
// /proc/sysvipc/shm, which procfs does not read. Lines that do not parse
// are left out.
func SharedMemory() ([]Segment, error) {
	b, err := os.ReadFile(filepath.Join(root, "sysvipc", "shm"))
	if err != nil {
		return nil, err
	}
	var out []Segment
	// After a line of column names: key shmid perms size cpid lpid nattch ...
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		id, err1 := strconv.Atoi(f[1])
		cpid, err2 := strconv.Atoi(f[4])
		nattch, err3 := strconv.Atoi(f[6])
		if errors.Join(err1, err2, err3) != nil {
			continue
		}
		out = append(out, Segment{ID: id, Creator: cpid, Attached: nattch})
	}
	return out, nil
}
