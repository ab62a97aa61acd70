// Package report is the load tester's JSON report: what one run offered,
// what the relay did with it, and where it ran. The load tester writes it;
// the capacity page is rendered from the reports kept in docs/evidence.
package report

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

// Report is one run. Field names are part of the evidence format: the
// capacity page reads them, so rename only with a migration of the files.
type Report struct {
	Name    string    `json:"name"`
	Date    time.Time `json:"date"`
	Command []string  `json:"command"`
	OK      bool      `json:"ok"`
	// Failures says why OK is false, one sentence each.
	Failures []string `json:"failures,omitempty"`

	Git     Git     `json:"git"`
	Go      string  `json:"go_version"`
	Machine Machine `json:"machine"`
	Config  Config  `json:"config"`

	Store    string `json:"store"`
	Replicas int    `json:"replicas"`

	// HeldPolls is the peak number of polls in flight at once.
	HeldPolls int `json:"held_polls"`
	// OfferedRate is the schedule's sends per second; AchievedRate is
	// accepted sends per second from the first scheduled send to the last
	// accepted one.
	OfferedRate  float64 `json:"offered_rate"`
	AchievedRate float64 `json:"achieved_rate"`
	// WindowSeconds is the measured window: first scheduled send to the end
	// of the drain.
	WindowSeconds float64 `json:"window_seconds"`

	Scheduled int `json:"scheduled"`
	// LateSends started more than LateThreshold after their schedule; they
	// were sent anyway.
	LateSends       int     `json:"late_sends"`
	LateThresholdMS float64 `json:"late_threshold_ms"`
	Accepted        int     `json:"accepted"`
	// Refused are sends answered 429 or 503, by "<status> <code>". They are
	// the relay's admission at work, not losses.
	Refused    map[string]int `json:"refused"`
	Delivered  int            `json:"delivered"`
	Lost       int            `json:"lost"`
	Duplicates int            `json:"duplicates"`
	Reordered  int            `json:"reordered"`
	Unexpected int            `json:"unexpected"`
	// Unconfirmed are sends whose answer never arrived (a transport error)
	// but that were delivered: the relay committed them.
	Unconfirmed int `json:"unconfirmed_delivered"`
	// Errors counts everything that went wrong, by kind. Refused sends are
	// not here.
	Errors map[string]int `json:"errors"`

	LatencyMS Latencies `json:"latency_ms"`
	Relay     Relay     `json:"relay"`
	// LoadTester is the tester's own cost: it shares the machine.
	LoadTester Process `json:"loadtester"`
}

// Git says which code ran. A dirty tree means the commit alone does not
// describe it.
type Git struct {
	Commit     string `json:"commit"`
	Dirty      bool   `json:"dirty"`
	DirtyPaths int    `json:"dirty_paths,omitempty"`
}

// Machine is where the run happened.
type Machine struct {
	CPUModel      string `json:"cpu_model"`
	CPUs          int    `json:"cpus"`
	OS            string `json:"os"`
	OpenFileSoft  uint64 `json:"open_file_limit"`
	OpenFileHard  uint64 `json:"open_file_limit_hard"`
	RelayOpenFile uint64 `json:"relay_open_file_limit,omitempty"`
}

// Config is what was asked for.
type Config struct {
	Target          string  `json:"target"` // "throwaway" or the URLs
	Pairs           int     `json:"pairs"`
	Rate            float64 `json:"rate"`
	DurationSeconds float64 `json:"duration_seconds"`
	WaitSeconds     int     `json:"wait_seconds"`
	PayloadBytes    int     `json:"payload_bytes"`
	Codec           string  `json:"codec"`
	Herd            bool    `json:"herd"`
	DrainSeconds    float64 `json:"drain_seconds"`
}

// Latencies are the run's latency distributions, in milliseconds.
type Latencies struct {
	// AcceptedToReturned: the send's 202 arrived -> the poll carrying it
	// returned. The original capacity page's figure. It can be negative:
	// the relay wakes the poll before it answers the sender.
	AcceptedToReturned Summary `json:"accepted_to_returned"`
	// StartedToReturned: the send request started -> the poll returned.
	StartedToReturned Summary `json:"started_to_returned"`
	// SendRequest: the send request started -> its 202 arrived.
	SendRequest Summary `json:"send_request"`
}

// Summary is an exact distribution over every sample, in milliseconds.
type Summary struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99_9"`
	Max  float64 `json:"max"`
}

// Relay is what the relay processes cost, summed over replicas.
type Relay struct {
	// Source is "proc" (read from /proc of the processes the tester
	// started), "metrics" (scraped) or "" when unknown.
	Source    string `json:"source"`
	Processes int    `json:"processes"`
	// CPUSeconds is user+system time over the measured window.
	CPUSeconds float64 `json:"cpu_seconds"`
	// CPUSecondsTotal is the processes' whole lifetime, boot included.
	CPUSecondsTotal float64 `json:"cpu_seconds_total"`
	// PeakRSSBytes is the sum of each process's peak (VmHWM), or the
	// highest sampled resident memory when scraped.
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
}

// Process is one process's own cost.
type Process struct {
	CPUSeconds   float64 `json:"cpu_seconds"`
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
}

// Summarize returns the exact percentiles of samples. It sorts samples in
// place. Percentiles are nearest-rank: the smallest sample with at least p%
// of the samples at or below it.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	slices.Sort(samples)
	return Summary{
		N:    len(samples),
		P50:  ms(Percentile(samples, 50)),
		P95:  ms(Percentile(samples, 95)),
		P99:  ms(Percentile(samples, 99)),
		P999: ms(Percentile(samples, 99.9)),
		Max:  ms(samples[len(samples)-1]),
	}
}

// Percentile is the nearest-rank p-th percentile of sorted, which must not
// be empty.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	// The epsilon keeps p99.9 of 1000 samples at rank 999, not 1000,
	// despite 99.9/100*1000 being a hair above 999 in floating point.
	rank := int(math.Ceil(p/100*float64(len(sorted)) - 1e-9))
	rank = max(rank, 1)
	rank = min(rank, len(sorted))
	return sorted[rank-1]
}

func ms(d time.Duration) float64 {
	// Microsecond resolution is plenty and keeps the files readable.
	return math.Round(float64(d)/float64(time.Microsecond)) / 1000
}

// Write stores r as indented JSON at path.
func Write(path string, r *Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// Read loads a report written by Write.
func Read(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read report: %w", err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode report %s: %w", path, err)
	}
	return &r, nil
}

// Line is the one human-readable summary of r.
func (r *Report) Line() string {
	verdict := "ok"
	if !r.OK {
		verdict = "FAIL"
	}
	l := r.LatencyMS.AcceptedToReturned
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s store=%s replicas=%d pairs=%d held=%d offered=%.1f/s achieved=%.1f/s",
		verdict, r.Name, r.Store, r.Replicas, r.Config.Pairs, r.HeldPolls, r.OfferedRate, r.AchievedRate)
	fmt.Fprintf(&b, " accepted=%d refused=%d delivered=%d lost=%d dup=%d reordered=%d unexpected=%d errors=%d late=%d",
		r.Accepted, sum(r.Refused), r.Delivered, r.Lost, r.Duplicates, r.Reordered, r.Unexpected, sum(r.Errors), r.LateSends)
	fmt.Fprintf(&b, " accepted->returned p50=%s p95=%s p99=%s max=%s",
		FormatMS(l.P50), FormatMS(l.P95), FormatMS(l.P99), FormatMS(l.Max))
	if r.Relay.Source != "" {
		fmt.Fprintf(&b, " relay cpu=%.1fs (%.2f cores) rss=%s",
			r.Relay.CPUSeconds, Cores(r), FormatBytes(r.Relay.PeakRSSBytes))
	}
	return b.String()
}

// Cores is the relay's average CPU use over the measured window.
func Cores(r *Report) float64 {
	if r.WindowSeconds <= 0 {
		return 0
	}
	return r.Relay.CPUSeconds / r.WindowSeconds
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// Total is the sum of a by-kind count.
func Total(m map[string]int) int { return sum(m) }

// FormatMS prints a latency the way the capacity tables do: milliseconds
// below a second, seconds above.
func FormatMS(v float64) string {
	switch {
	case math.Abs(v) >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.0f ms", v)
	default:
		return fmt.Sprintf("%.1f ms", v)
	}
}

// FormatBytes prints a size in MB (10^6), as the original capacity page did.
func FormatBytes(n int64) string {
	return fmt.Sprintf("%.0f MB", float64(n)/1e6)
}
