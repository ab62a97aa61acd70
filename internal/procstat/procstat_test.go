package procstat

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

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
	zombie(t, pid)
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

// zombie waits for child pid's exit without reaping it.
func zombie(t *testing.T, pid int) {
	t.Helper()
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
}

// TestWithArg: a child is found by part of an argument of its own until
// it exits: a zombie, with no command line, is not listed.
func TestWithArg(t *testing.T) {
	mark := "procstat-test-" + strconv.Itoa(os.Getpid())
	cmd := exec.Command("sh", "-c", "read x", "--mark="+mark)
	if _, err := cmd.StdinPipe(); err != nil { // never written: sh waits
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	found := WithArg(mark)
	want := []Command{{PID: cmd.Process.Pid, Args: cmd.Args}}
	if !slices.EqualFunc(found, want, equalCommand) {
		t.Errorf("WithArg(%q) = %v, want %v", mark, found, want)
	}
	_ = cmd.Process.Kill()
	zombie(t, cmd.Process.Pid)
	if found := WithArg(mark); len(found) != 0 {
		t.Errorf("exited, yet WithArg(%q) = %v", mark, found)
	}
	_ = cmd.Wait()
}

func equalCommand(a, b Command) bool { return a.PID == b.PID && slices.Equal(a.Args, b.Args) }

// TestOwn reads this process's own entries and checks them against what
// the kernel says another way.
func TestOwn(t *testing.T) {
	pid := os.Getpid()

	// CPU time, as getrusage counts it too, once there is enough of it
	// that a wrong unit shows.
	var ru unix.Rusage
	for {
		if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		if ru.Utime.Nano()+ru.Stime.Nano() > int64(300*time.Millisecond) {
			break
		}
		for i := 0; i < 1e6; i++ {
			_ = i * i
		}
	}
	rusage := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	cpu, err := CPUTime(pid)
	if err != nil || cpu < rusage-100*time.Millisecond || cpu > rusage+100*time.Millisecond {
		t.Errorf("CPUTime = %v, %v; getrusage %v", cpu, err, rusage)
	}

	// Memory, in bytes: what is touched is resident.
	touched := make([]byte, 128<<20)
	for i := range touched {
		touched[i] = 1
	}
	rss, err1 := RSS(pid)
	peak, err2 := PeakRSS(pid)
	if err1 != nil || err2 != nil || rss < 128<<20 || peak < rss {
		t.Errorf("RSS %d, %v; peak %d, %v; with 128 MiB touched", rss, err1, peak, err2)
	}
	runtime.KeepAlive(touched)

	var nofile, as unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	if n, err := OpenFileLimit(pid); err != nil || n != nofile.Cur {
		t.Errorf("OpenFileLimit = %d, %v; getrlimit %d", n, err, nofile.Cur)
	}
	if err := unix.Getrlimit(unix.RLIMIT_AS, &as); err != nil {
		t.Fatal(err)
	}
	wantAS := int64(as.Cur)
	if as.Cur == unix.RLIM_INFINITY {
		wantAS = -1
	}
	if n, err := AddressSpaceLimit(pid); err != nil || n != wantAS {
		t.Errorf("AddressSpaceLimit = %d, %v; getrlimit %d", n, err, as.Cur)
	}

	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if cwd, err := Cwd(pid); err != nil || cwd != wd {
		t.Errorf("Cwd = %q, %v; want %q", cwd, err, wd)
	}
	if args, err := Args(pid); err != nil || !slices.Equal(args, os.Args) {
		t.Errorf("Args = %q, %v; want %q", args, err, os.Args)
	}
	cgs, err := Cgroups(pid)
	if err != nil || len(cgs) == 0 {
		t.Errorf("Cgroups = %v, %v", cgs, err)
	}
	for _, c := range cgs {
		if !strings.HasPrefix(c.Path, "/") {
			t.Errorf("cgroup %+v", c)
		}
	}
}

// TestMachine reads the machine's entries and checks them against what
// the kernel says another way.
func TestMachine(t *testing.T) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	if rel, err := Sysctl("kernel/osrelease"); err != nil || rel != unix.ByteSliceToString(u.Release[:]) {
		t.Errorf("kernel/osrelease = %q, %v; uname %q", rel, err, unix.ByteSliceToString(u.Release[:]))
	}
	if r, err := SysctlInts("net/ipv4/ip_local_port_range"); err != nil || len(r) != 2 || r[0] < 1 || r[1] < r[0] || r[1] > 65535 {
		t.Errorf("ip_local_port_range = %v, %v", r, err)
	}
	ms, err := Mounts()
	if err != nil || !slices.ContainsFunc(ms, func(m *Mount) bool { return m.MountPoint == "/proc" && m.FSType == "proc" }) {
		t.Errorf("no proc on /proc among %d mounts (%v)", len(ms), err)
	}
	if n, err := TCPMemory(); err != nil || n < 0 {
		t.Errorf("TCPMemory = %d, %v", n, err)
	}
	if runtime.GOARCH == "amd64" {
		b, err := os.ReadFile("/proc/cpuinfo")
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^model name\s*:\s*(.*?)\s*$`).FindSubmatch(b)
		if m == nil || CPUModel() != string(m[1]) {
			t.Errorf("CPUModel = %q; /proc/cpuinfo has %q", CPUModel(), m)
		}
	}
}

// TestSharedMemory: a segment this process makes is listed, by it and
// with nothing attached, until it is removed.
func TestSharedMemory(t *testing.T) {
	id, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600)
	if err != nil {
		t.Skipf("no System V shared memory: %v", err)
	}
	removed := false
	remove := func() {
		if !removed {
			removed = true
			if _, err := unix.SysvShmCtl(id, unix.IPC_RMID, nil); err != nil {
				t.Error(err)
			}
		}
	}
	defer remove()
	mine := func(s Segment) bool { return s.ID == id }
	segs, err := SharedMemory()
	if i := slices.IndexFunc(segs, mine); err != nil || i < 0 || segs[i] != (Segment{ID: id, Creator: os.Getpid()}) {
		t.Errorf("segment %d in %+v (%v)", id, segs, err)
	}
	remove()
	if segs, err := SharedMemory(); err != nil || slices.ContainsFunc(segs, mine) {
		t.Errorf("removed segment %d still in %+v (%v)", id, segs, err)
	}
}

// TestStartTime: a process's start time stays the same while it runs,
// as the fields around it (CPU times) do not.
func TestStartTime(t *testing.T) {
	first := StartTime(os.Getpid())
	for i := 0; i < 1e7; i++ { // some CPU time, which moves fields 14 and 15
		_ = i * i
	}
	if again := StartTime(os.Getpid()); first == "" || again != first {
		t.Errorf("start time %q, then %q", first, again)
	}
	if StartTime(-1) != "" {
		t.Error("a start time for pid -1")
	}
}

// statLine is a /proc/<pid>/stat line of 52 fields; comm, state, ppid,
// utime (14), stime (15) and starttime (22) as given.
func statLine(pid int, comm, state string, ppid, utime, stime, start int) string {
	f := []string{strconv.Itoa(pid), "(" + comm + ")", state, strconv.Itoa(ppid),
		"42", "42", "0", "-1", "4194560", "100", "0", "0", "0", strconv.Itoa(utime), strconv.Itoa(stime),
		"0", "0", "20", "0", "1", "0", strconv.Itoa(start), "1000000", "200", "18446744073709551615"}
	for len(f) < 52 {
		f = append(f, "0")
	}
	return strings.Join(f, " ") + "\n"
}

const limits = `Limit                     Soft Limit           Hard Limit           Units     
Max cpu time              unlimited            unlimited            seconds   
Max file size             unlimited            unlimited            bytes     
Max stack size            8388608              unlimited            bytes     
Max processes             96367                96367                processes 
Max open files            %d                 4096                 files     
Max address space         %s            unlimited            bytes     
Max nice priority         0                    0                    
Max realtime timeout      unlimited            unlimited            us        
`

// sample lays out a fixed /proc and reads from it for the rest of the
// test: process 42, whose command name holds spaces and parentheses, and
// its zombie child 43, whose command name looks like the fields after it.
func sample(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"42/stat":    statLine(42, "a b) c", "S", 7, 250, 130, 123456),
		"42/status":  "Name:\ta b) c\nState:\tS (sleeping)\nVmPeak:\t    9000 kB\nVmHWM:\t    5000 kB\nVmRSS:\t    4000 kB\n",
		"42/limits":  strings.Replace(strings.Replace(limits, "%d", "1024", 1), "%s", "unlimited", 1),
		"42/cgroup":  "4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/user.slice\n",
		"42/cmdline": "sleep\x0060\x00",
		"43/stat":    statLine(43, "x) R 99 (y", "Z", 42, 1, 2, 123999),
		"43/status":  "Name:\tx) R 99 (y\nState:\tZ (zombie)\n",
		"43/limits":  strings.Replace(strings.Replace(limits, "%d", "2048", 1), "%s", "3221225472", 1),
		"43/cmdline": "",
		"self/mountinfo": "25 30 0:22 / /sys/fs/cgroup/memory rw,nosuid shared:9 - cgroup cgroup rw,memory\n" +
			`26 30 0:23 /with\040space /mnt/with\040space rw,relatime - cgroup2 cgroup2 rw` + "\n",
		"cpuinfo":                          "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Sample CPU @ 2.00GHz\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Sample CPU @ 2.00GHz\n\n",
		"sys/kernel/osrelease":             "6.1.0-sample\n",
		"sys/net/ipv4/ip_local_port_range": "32768\t60999\n",
		"net/sockstat":                     "sockets: used 120\nUDP: inuse 1 mem 3\nTCP: inuse 3 orphan 0 tw 1 alloc 5 mem 7\nFRAG: inuse 0 memory 0\n",
		"sysvipc/shm": "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n" +
			"    745552          4   600                    56  2259 32504      5   101   104   101   104 1796679357 1796679357 1796678471                  4096                     0\n" +
			"         0         17   600              16777216    43     0      0     0     0     0     0          0          0 1796678471                     0                     0\n" +
			"garbage\n",
	}
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/srv/sample", filepath.Join(dir, "42", "cwd")); err != nil {
		t.Fatal(err)
	}
	old := root
	root = dir
	t.Cleanup(func() { root = old })
}

// TestSample reads every kind of entry from a fixed /proc.
func TestSample(t *testing.T) {
	sample(t)

	list := List()
	slices.SortFunc(list, func(a, b Proc) int { return a.PID - b.PID })
	if want := []Proc{{42, 7, "S"}, {43, 42, "Z"}}; !slices.Equal(list, want) {
		t.Errorf("List = %v, want %v", list, want)
	}
	if c := Children(42); !slices.Equal(c, []int{43}) {
		t.Errorf("Children(42) = %v", c)
	}
	if !Alive(42) || Alive(43) || Alive(44) {
		t.Errorf("alive: 42 %v, zombie 43 %v, missing 44 %v", Alive(42), Alive(43), Alive(44))
	}
	if s := StartTime(42); s != "123456" {
		t.Errorf("StartTime(42) = %q", s)
	}
	if s := StartTime(43); s != "123999" {
		t.Errorf("StartTime(43) = %q", s)
	}
	if c, err := CPUTime(42); err != nil || c != 3800*time.Millisecond {
		t.Errorf("CPUTime(42) = %v, %v; want 3.8s", c, err)
	}
	if n, err := PeakRSS(42); err != nil || n != 5000<<10 {
		t.Errorf("PeakRSS(42) = %d, %v", n, err)
	}
	if n, err := RSS(42); err != nil || n != 4000<<10 {
		t.Errorf("RSS(42) = %d, %v", n, err)
	}
	if n, err := PeakRSS(43); err == nil {
		t.Errorf("a zombie's peak: %d", n)
	}
	if n, err := RSS(43); err == nil {
		t.Errorf("a zombie's RSS: %d", n)
	}
	if n, err := OpenFileLimit(42); err != nil || n != 1024 {
		t.Errorf("OpenFileLimit(42) = %d, %v", n, err)
	}
	if n, err := AddressSpaceLimit(42); err != nil || n != -1 {
		t.Errorf("AddressSpaceLimit(42) = %d, %v; want -1, unlimited", n, err)
	}
	if n, err := AddressSpaceLimit(43); err != nil || n != 3<<30 {
		t.Errorf("AddressSpaceLimit(43) = %d, %v", n, err)
	}
	cgs, err := Cgroups(42)
	want := []Cgroup{
		{HierarchyID: 4, Controllers: []string{"memory"}, Path: "/process_api/abc"},
		{HierarchyID: 1, Controllers: []string{"cpu", "cpuacct"}, Path: "/"},
		{HierarchyID: 0, Path: "/user.slice"},
	}
	if err != nil || !slices.EqualFunc(cgs, want, func(a, b Cgroup) bool {
		return a.HierarchyID == b.HierarchyID && slices.Equal(a.Controllers, b.Controllers) && a.Path == b.Path
	}) {
		t.Errorf("Cgroups(42) = %+v, %v", cgs, err)
	}
	if d, err := Cwd(42); err != nil || d != "/srv/sample" {
		t.Errorf("Cwd(42) = %q, %v", d, err)
	}
	if c := WithArg("60"); len(c) != 1 || c[0].String() != "42: sleep 60" {
		t.Errorf("WithArg(60) = %v", c)
	}

	ms, err := Mounts()
	if err != nil || len(ms) != 2 {
		t.Fatalf("Mounts = %v, %v", ms, err)
	}
	if m := ms[0]; m.MountPoint != "/sys/fs/cgroup/memory" || m.Root != "/" || m.FSType != "cgroup" {
		t.Errorf("mount %+v", m)
	} else if _, ok := m.SuperOptions["memory"]; !ok {
		t.Errorf("mount %+v: no memory option", m)
	}
	if m := ms[1]; m.MountPoint != "/mnt/with space" || m.Root != "/with space" || m.FSType != "cgroup2" {
		t.Errorf("mount %+v", m)
	}
	if s, err := Sysctl("kernel/osrelease"); err != nil || s != "6.1.0-sample" {
		t.Errorf("osrelease %q, %v", s, err)
	}
	if r, err := SysctlInts("net/ipv4/ip_local_port_range"); err != nil || !slices.Equal(r, []int{32768, 60999}) {
		t.Errorf("ip_local_port_range %v, %v", r, err)
	}
	if n, err := TCPMemory(); err != nil || n != 7*int64(os.Getpagesize()) {
		t.Errorf("TCPMemory = %d, %v; want 7 pages", n, err)
	}
	segs, err := SharedMemory()
	if want := []Segment{{ID: 4, Creator: 2259, Attached: 5}, {ID: 17, Creator: 43}}; err != nil || !slices.Equal(segs, want) {
		t.Errorf("SharedMemory = %+v, %v; want %+v", segs, err, want)
	}
	// procfs parses /proc/cpuinfo as the architecture lays it out.
	if runtime.GOARCH == "amd64" || runtime.GOARCH == "386" {
		if m := CPUModel(); m != "Sample CPU @ 2.00GHz" {
			t.Errorf("CPUModel = %q", m)
		}
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"/sys/fs/cgroup/memory": "/sys/fs/cgroup/memory",
		`/mnt/with\040space`:    "/mnt/with space",
		`/odd\\`:                `/odd\\`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
