package memlimit

import (
	"os"
	"path/filepath"
	"testing"
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

func TestLimit(t *testing.T) {
	tests := []struct {
		name   string
		cgroup string
		files  map[string]string
		want   int64
	}{
		{"v2 own group", "0::/kubepods/pod1\n", map[string]string{"kubepods/pod1/memory.max": "268435456\n"}, 256 << 20},
		{"v2 no limit", "0::/user.slice\n", map[string]string{"user.slice/memory.max": "max\n"}, 0},
		{"v2 namespaced root", "0::/\n", map[string]string{"memory.max": "536870912\n"}, 512 << 20},
		{"v1 own group", "4:memory:/process_api/abc\n1:cpu:/\n", map[string]string{"memory/process_api/abc/memory.limit_in_bytes": "268435456\n"}, 256 << 20},
		{"v1 unlimited", "4:memory:/\n", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
		{"v1 combined controllers", "3:cpu,memory:/x\n", map[string]string{"memory/x/memory.limit_in_bytes": "1048576\n"}, 1 << 20},
		{"nothing readable", "4:memory:/gone\n", nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			root := filepath.Join(dir, "sys")
			write(t, filepath.Join(dir, "cgroup"), tt.cgroup)
			for p, data := range tt.files {
				write(t, filepath.Join(root, p), data)
			}
			if got := limit(filepath.Join(dir, "cgroup"), root); got != tt.want {
				t.Fatalf("limit = %d, want %d", got, tt.want)
			}
		})
	}
}
