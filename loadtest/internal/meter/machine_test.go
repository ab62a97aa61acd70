package meter

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flamenet/relay/internal/procstat"
)

// TestProcReadings: what the report takes from /proc is there (how it
// is read is procstat's to test).
func TestProcReadings(t *testing.T) {
	if l, err := OpenFileLimit(os.Getpid()); err != nil || l == 0 {
		t.Errorf("open-file limit = %d, %v", l, err)
	}
	if lo, hi, err := EphemeralPorts(); err != nil || lo < 1 || hi < lo {
		t.Errorf("ephemeral ports %d-%d, %v", lo, hi, err)
	}
	// The OS with its kernel release: "linux/amd64 6.1.0-...".
	if m := Machine(); m.CPUs < 1 || m.OpenFileSoft == 0 || len(strings.Fields(m.OS)) != 2 {
		t.Errorf("machine = %+v", m)
	}
}

func TestParseProcessMetrics(t *testing.T) {
	text := `# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
process_resident_memory_bytes 4.4e+07
fn_held_polls 3
`
	cpu, rss, err := parseProcessMetrics(strings.NewReader(text))
	if err != nil || cpu != 12.5 || rss != 44_000_000 {
		t.Errorf("got %v, %v, %v", cpu, rss, err)
	}
	if _, _, err := parseProcessMetrics(strings.NewReader("fn_held_polls 3\n")); err == nil {
		t.Error("metrics without process figures accepted")
	}
}

// TestRelaysHeld reads fn_held_polls from each relay's metrics and sums
// them, as a herd does before its sends; a relay without the series is an
// error, not zero.
func TestRelaysHeld(t *testing.T) {
	serve := func(text string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, text)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	a := serve("# TYPE fn_held_polls gauge\nfn_held_polls_limit 100\nfn_held_polls 3\n")
	b := serve("fn_held_polls 4\n")
	none := serve("fn_held_polls_limit 100\n")
	ctx := context.Background()
	if n, err := RelaysHeld(ctx, http.DefaultClient, []string{a, b}); err != nil || n != 7 {
		t.Errorf("two relays: %d, %v; want 7", n, err)
	}
	if _, err := RelaysHeld(ctx, http.DefaultClient, []string{a, none}); err == nil {
		t.Error("a relay without fn_held_polls counted")
	}
}

// TestMetricsMeter scrapes a real Prometheus process collector (this test
// process's own), as -metrics-url does a relay's, summed over two URLs.
func TestMetricsMeter(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	m := NewMetrics([]string{srv.URL, srv.URL}, srv.Client())
	ctx := context.Background()
	// The kernel counts CPU time in ticks: a test process this light may
	// not have used one yet.
	for {
		cpu, err := procstat.CPUTime(os.Getpid())
		if err != nil || cpu >= 50*time.Millisecond {
			break
		}
	}
	start, err := m.CPU(ctx)
	if err != nil || start <= 0 {
		t.Fatalf("cpu = %v, %v", start, err)
	}
	got := m.Read(ctx, start)
	if got.Source != "metrics" || got.Processes != 2 || got.CPUSecondsTotal < start.Seconds() || got.CPUSeconds < 0 {
		t.Errorf("read = %+v (start %v)", got, start)
	}
	own, err := procstat.RSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Two URLs of one process: about twice its resident memory.
	if got.PeakRSSBytes < own || got.PeakRSSBytes > 4*own {
		t.Errorf("peak RSS %d, own RSS %d", got.PeakRSSBytes, own)
	}
	srv.Close()
	if _, err := m.CPU(ctx); err == nil {
		t.Error("scrape of a closed endpoint succeeded")
	}
}

// TestReadSeries reads series with and without labels, in whatever order
// and spacing the exposition gives the labels; a series it lacks is
// absent, not zero.
func TestReadSeries(t *testing.T) {
	text := `# HELP fn_redis_device_subscription_changes_total Device channels.
# TYPE fn_redis_device_subscription_changes_total counter
fn_redis_device_subscription_changes_total{op="subscribe"} 5000
fn_redis_device_subscription_changes_total{op="unsubscribe"} 12
fn_x_total{ op = "a b\"}" , hub="redis", } 7 1700000000000
fn_redis_wakeups_received_total 1.234e+03
fn_held_polls_limit 100
fn_held_polls 3
`
	want := []string{
		`fn_redis_device_subscription_changes_total{op="subscribe"}`,
		`fn_redis_device_subscription_changes_total{op="unsubscribe"}`,
		`fn_x_total{hub="redis",op="a b\"}"}`,
		"fn_redis_wakeups_received_total",
		"fn_held_polls",
		"fn_redis_wakeups_unheld_total",
		`fn_redis_device_subscription_commands_total{op="subscribe"}`,
		`fn_redis_device_subscription_changes_total{op="other"}`,
		"fn_redis_device_subscription_changes_total",
	}
	got, err := readSeries(strings.NewReader(text), want...)
	if err != nil {
		t.Fatal(err)
	}
	wantGot := map[string]float64{
		want[0]: 5000, want[1]: 12, want[2]: 7, want[3]: 1234, want[4]: 3,
	}
	if !reflect.DeepEqual(got, wantGot) {
		t.Errorf("got %v, want %v", got, wantGot)
	}
	if _, err := readSeries(strings.NewReader("fn_held_polls x\n"), "fn_held_polls"); err == nil {
		t.Error("a wanted series' value that does not parse was accepted")
	}
	// Only a wanted series' value must parse.
	if got, err := readSeries(strings.NewReader("fn_other x\nfn_held_polls 2\n"), "fn_held_polls"); err != nil || got["fn_held_polls"] != 2 {
		t.Errorf("got %v, %v", got, err)
	}
}

func TestParseSample(t *testing.T) {
	for _, tc := range []struct {
		line, series, value string
		ok                  bool
	}{
		{"fn_held_polls 3", "fn_held_polls", "3", true},
		{"  fn_held_polls\t3  ", "fn_held_polls", "3", true},
		{`fn_c{b="2",a="1"} +Inf`, `fn_c{a="1",b="2"}`, "+Inf", true},
		{`fn_c{} 1`, "fn_c", "1", true},
		{`fn_c{a="x\\"} 1`, `fn_c{a="x\\"}`, "1", true},
		{"# TYPE fn_held_polls gauge", "", "", false},
		{"", "", "", false},
		{"fn_held_polls", "", "", false},
		{`fn_c{a="unterminated} 1`, "", "", false},
		{`fn_c{a=1} 1`, "", "", false},
		{`fn_c{a="1" b="2"} 1`, "", "", false},
		{`{"utf8.name"} 1`, "", "", false},
	} {
		series, value, ok := parseSample(tc.line)
		if series != tc.series || value != tc.value || ok != tc.ok {
			t.Errorf("parseSample(%q) = %q, %q, %v; want %q, %q, %v", tc.line, series, value, ok, tc.series, tc.value, tc.ok)
		}
	}
}
