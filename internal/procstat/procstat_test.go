package procstat

import "testing"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		stat  string
		state string
		ppid  int
		ok    bool
	}{
		{"123 (postgres) S 1 120 120 0 -1", "S", 1, true},
		{"124 (a) b) Z 123 120 120 0", "Z", 123, true},
		{"125 (x)", "", 0, false},
	} {
		state, ppid, ok := Parse(tc.stat)
		if state != tc.state || ppid != tc.ppid || ok != tc.ok {
			t.Errorf("Parse(%q) = %q %d %v, want %q %d %v", tc.stat, state, ppid, ok, tc.state, tc.ppid, tc.ok)
		}
	}
}
