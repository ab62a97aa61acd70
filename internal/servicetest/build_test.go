package servicetest

import (
	"fmt"
	"strings"
	"testing"
)

// TestStartTimeEnd: a process's stat line is cut right after its start
// time (field 22), also when its command name holds spaces and a ")".
func TestStartTimeEnd(t *testing.T) {
	var fields []string
	for i := 3; i <= 30; i++ {
		fields = append(fields, fmt.Sprint(1000+i))
	}
	for _, name := range []string{"(go)", "(a b) c)"} {
		line := "42 " + name + " " + strings.Join(fields, " ") + "\n"
		got := line[:startTimeEnd([]byte(line))]
		if !strings.HasSuffix(got, " 1021 1022") {
			t.Errorf("%q cut to %q, want it to end with fields 21 and 22", line, got)
		}
	}
}
