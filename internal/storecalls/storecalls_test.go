package storecalls

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flamenet/relay/store"
)

// storeOp is the op a method of store.Store is counted under: its name in
// snake case.
func storeOp(method string) string {
	var b strings.Builder
	for i, r := range method {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// TestCountsEveryMethod: counted declares every method of store.Store
// itself, and each call counts once, under its own op. A
// method promoted from an embedded store would pass calls through
// uncounted.
func TestCountsEveryMethod(t *testing.T) {
	methods := reflect.TypeFor[store.Store]()
	for i := range methods.NumMethod() {
		name := methods.Method(i).Name
		op := storeOp(name)
		calls := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "calls"}, []string{"op"})
		// No store behind the counter: the call panics when it reaches
		// the store, after counting. A method promoted from an embedded
		// store reaches it at once, and counts nothing.
		m := reflect.ValueOf(Count(nil, calls)).MethodByName(name)
		args := make([]reflect.Value, m.Type().NumIn())
		for j := range args {
			args[j] = reflect.Zero(m.Type().In(j))
		}
		func() {
			defer func() { _ = recover() }()
			m.Call(args)
		}()
		if n := testutil.CollectAndCount(calls); n != 1 {
			t.Errorf("%s counted under %d ops, want 1 (%q): does counted declare it?", name, n, op)
			continue
		}
		if got := testutil.ToFloat64(calls.WithLabelValues(op)); got != 1 {
			t.Errorf("%s counted %v times under op %q, want once", name, got, op)
		}
	}
}

// TestStoreOpsDocumented keeps the ops that docs/OPERATIONS.md lists for
// fn_store_calls_total those that Count counts.
func TestStoreOpsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	const row = "| `fn_store_calls_total{op}` |"
	var desc string
	for line := range strings.Lines(string(b)) {
		if cols := strings.Split(line, " | "); strings.HasPrefix(line, row) && len(cols) > 2 {
			desc = cols[2] // name, type, description, signal
		}
	}
	if desc == "" {
		t.Fatalf("docs/OPERATIONS.md has no row %s", row)
	}
	var documented []string
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(desc, -1) {
		documented = append(documented, m[1])
	}
	var counted []string
	methods := reflect.TypeFor[store.Store]()
	for i := range methods.NumMethod() {
		counted = append(counted, storeOp(methods.Method(i).Name))
	}
	slices.Sort(documented)
	slices.Sort(counted)
	if !slices.Equal(documented, counted) {
		t.Errorf("docs/OPERATIONS.md lists the ops %v, want %v", documented, counted)
	}
}
