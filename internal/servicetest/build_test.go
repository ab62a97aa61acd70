package servicetest

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestStartTime: a process's start time is read from its stat line (field
// 22), also when its command name holds spaces and a ")", and it stays the
// same while the process runs, as the fields around it do not.
func TestStartTime(t *testing.T) {
	var fields []string
	for i := 3; i <= 30; i++ {
		fields = append(fields, fmt.Sprint(1000+i))
	}
	for _, name := range []string{"(go)", "(a b) c)"} {
		line := "42 " + name + " " + strings.Join(fields, " ") + "\n"
		if got := startTime([]byte(line)); got != "1022" {
			t.Errorf("%q: start time %q, want 1022", line, got)
		}
	}
	read := func() string {
		stat, err := os.ReadFile("/proc/self/stat")
		if err != nil {
			t.Skip("no /proc:", err)
		}
		return startTime(stat)
	}
	first := read()
	for i := 0; i < 1e7; i++ { // some CPU time, which moves fields 14 and 15
		_ = i * i
	}
	if again := read(); first == "" || again != first {
		t.Errorf("start time %q, then %q", first, again)
	}
}
