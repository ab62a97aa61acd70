package memlimit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/flamenet/relay/internal/procstat"
)

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// v2 is a process's cgroups on a unified hierarchy alone.
func v2(path string) []procstat.Cgroup {
	return []procstat.Cgroup{{HierarchyID: 0, Path: path}}
}

// v1 is a cgroup on a v1 hierarchy.
func v1(id int, path string, controllers ...string) procstat.Cgroup {
	return procstat.Cgroup{HierarchyID: id, Controllers: controllers, Path: path}
}

func TestLimit(t *testing.T) {
	tests := []struct {
		name    string
		cgroups []procstat.Cgroup
		files   map[string]string
		want    int64
	}{
		{"v2 own group", v2("/kubepods/pod1"), map[string]string{"kubepods/pod1/memory.max": "268435456\n"}, 256 << 20},
		{"v2 no limit", v2("/user.slice"), map[string]string{"user.slice/memory.max": "max\n"}, 0},
		{"v2 namespaced root", v2("/"), map[string]string{"memory.max": "536870912\n"}, 512 << 20},
		{"v1 own group", []procstat.Cgroup{v1(4, "/process_api/abc", "memory"), v1(1, "/", "cpu")}, map[string]string{"memory/process_api/abc/memory.limit_in_bytes": "268435456\n"}, 256 << 20},
		{"v1 unlimited", []procstat.Cgroup{v1(4, "/", "memory")}, map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
		{"v1 combined controllers", []procstat.Cgroup{v1(3, "/x", "cpu", "memory")}, map[string]string{"memory/x/memory.limit_in_bytes": "1048576\n"}, 1 << 20},
		{"nothing readable", []procstat.Cgroup{v1(4, "/gone", "memory")}, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			root := filepath.Join(dir, "sys")
			for p, data := range tt.files {
				write(t, filepath.Join(root, p), data)
			}
			if got := limit(tt.cgroups, root); got != tt.want {
				t.Fatalf("limit = %d, want %d", got, tt.want)
			}
		})
	}
}
