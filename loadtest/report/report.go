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
	"strconv"
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

	// The fields below are newer than the first reports and absent from
	// them; the capacity page shows them only where a report has them.

	// Redelivered are arrivals of an envelope already received, with the
	// same id and seq, after a crash, under -ack explicit: the relay lost
	// the acknowledgement with the crash and handed the envelope again,
	// as it may; or with the same sender and id after a resynchronisation
	// (see Resyncs), whatever its seq. They are not duplicates and do not
	// fail the run.
	Redelivered int `json:"redelivered,omitempty"`
	// CursorAhead are the 409 cursor_ahead answers to the recipients'
	// polls and acks: their cursor was above the device's head, or of a
	// store epoch that is no longer the current one (the store's history
	// went back). Resyncs are the polls without cursor and epoch that
	// answered after them, from which each recipient went on. Those with
	// the store's history intact are also counted in Errors.
	CursorAhead int `json:"cursor_ahead,omitempty"`
	Resyncs     int `json:"resyncs,omitempty"`
	// RedeliveryNote says why a run with -ack explicit and crashes saw no
	// redelivery.
	RedeliveryNote string `json:"redelivery_note,omitempty"`
	// Retried are requests that failed while a relay was down for a crash
	// (from the kill until a second after it answered again), by kind; the
	// client retried them, and they are not errors.
	Retried map[string]int `json:"retried,omitempty"`
	// Crashes are the relay crashes the tester caused.
	Crashes []Crash `json:"crashes,omitempty"`
	// HeldPollsEnd is the tester's count of polls in flight when the
	// offered window ended: the highest seen in the 250 ms after, since a
	// poll just answered is between its answer and the next poll.
	HeldPollsEnd int `json:"held_polls_end,omitempty"`
	// HerdHeldMS is, under -herd, how long the population took to hold
	// its polls: from the instant every first poll started until the
	// relays' fn_held_polls counted them all (the tester's own count where
	// it cannot read the relays' metrics), or until one wait ran out. The
	// sends start then.
	HerdHeldMS float64 `json:"herd_held_ms,omitempty"`
	// Steady is the relay's memory while the population held still.
	Steady  *Steady  `json:"steady,omitempty"`
	Hostile *Hostile `json:"hostile,omitempty"`
	// Renewals are the renewers' renewals (-renewers), beside the load and
	// any flood.
	Renewals *Renewals `json:"renewals,omitempty"`
	Memory   *Memory   `json:"memory_limit,omitempty"`
	Redis    *Redis    `json:"redis,omitempty"`
	// Campaign is a -faults run's campaign.
	Campaign *Campaign `json:"campaign,omitempty"`
	// Failover is a -failover run's loss of the Postgres primary.
	Failover *Failover `json:"failover,omitempty"`
	// Wakes are, with several relays the tester started, each relay's
	// Redis wake-ups over the window of Relay.CPUSeconds: what the relays
	// tell each other costs them, and where it is spent.
	Wakes []RelayWakes `json:"wakes,omitempty"`
}

// RelayWakes is one relay's Redis wake-ups, read from its metrics at the
// start and the end of the window of Relay.CPUSeconds: counters are their
// increase over it, gauges their value at its end. A value is absent,
// never 0, where the relay does not export the series (an older relay),
// could not be read, or, for the counters, was restarted in the window.
type RelayWakes struct {
	// Relay is the relay's index (0-based).
	Relay int `json:"relay"`
	// Received are the wake-ups it heard from other relays; Unheld those
	// of them for devices with no poll or stream held there, which cost
	// it without use.
	Received *float64 `json:"received,omitempty"`
	Unheld   *float64 `json:"unheld,omitempty"`
	// Subscribes and Unsubscribes are the device channels it subscribed
	// to and left, as the devices it holds came and went;
	// SubscribeCommands and UnsubscribeCommands the commands that did it,
	// each of which may carry many channels.
	Subscribes          *float64 `json:"subscribes,omitempty"`
	Unsubscribes        *float64 `json:"unsubscribes,omitempty"`
	SubscribeCommands   *float64 `json:"subscribe_commands,omitempty"`
	UnsubscribeCommands *float64 `json:"unsubscribe_commands,omitempty"`
	// SubscriptionsEnd is the device channels it subscribed to at the
	// window's end, HeldPollsEnd the polls it held then: the first should
	// follow the second, not every device of the run.
	SubscriptionsEnd *float64 `json:"subscriptions_end,omitempty"`
	HeldPollsEnd     *float64 `json:"held_polls_end,omitempty"`
}

// Campaign is a fault campaign: the faults a seed planned and what became
// of them, and what the checks found beyond the delivery figures.
type Campaign struct {
	// Seed drew the plan (a string: JSON numbers lose 64-bit seeds).
	Seed string `json:"seed"`
	// Replay is the command that runs the same campaign again.
	Replay string  `json:"replay"`
	Faults []Fault `json:"faults"`
	// Removals are the planned removals of recipients, each followed by a
	// registration with a fresh token.
	Removals int `json:"removals"`
	// ClientCrashes are recipients' clients that crashed before
	// acknowledging what they had received; what the relay handed them
	// again is counted in the report's redelivered, not as duplicates.
	ClientCrashes int `json:"client_crashes"`
	// Owed are accepted sends that overlapped only a registration never
	// removed: each must arrive exactly once. Excused overlapped only
	// removed ones, and may have gone with them; ExcusedDelivered of those
	// arrived all the same. Straddling overlapped a removal and the
	// registration after it; they are not owed.
	Owed             int `json:"owed"`
	Excused          int `json:"excused"`
	ExcusedDelivered int `json:"excused_delivered"`
	Straddling       int `json:"straddling"`
	// RemovalAnswers are answers a removal explains, by kind: sends to the
	// removed device (404 unknown_device), its old token's polls and acks
	// (401), and those a relay accepted before the removal can have
	// reached it (within a second of the removal's 204, or of the end of
	// a fault that delayed the news), as PROTOCOL.md allows.
	RemovalAnswers map[string]int `json:"removal_answers,omitempty"`
	// StaleChecks are the answers to the old token's poll and ack at
	// another relay after each removal, and the directory reads before
	// each registration, by kind.
	StaleChecks map[string]int `json:"stale_checks,omitempty"`
	// Violations are broken promises beyond the delivery counts, by kind;
	// Examples say where, the first few of each.
	Violations map[string]int `json:"violations,omitempty"`
	Examples   []string       `json:"examples,omitempty"`
}

// Fault is one planned fault and what became of it.
type Fault struct {
	// AtSeconds is when the plan put it, after the first scheduled send.
	AtSeconds float64 `json:"at_seconds"`
	Kind      string  `json:"kind"`
	// Target is the relay, or the pair whose recipient; -1 for Postgres
	// and Redis.
	Target int     `json:"target"`
	HoldMS float64 `json:"hold_ms"`
	// Plan is the fault as the tester printed it.
	Plan string `json:"plan"`
	// StartedSeconds and HealedSeconds are when it began and when its
	// target answered again (a removal: when it registered again).
	StartedSeconds float64 `json:"started_seconds"`
	HealedSeconds  float64 `json:"healed_seconds"`
	Error          string  `json:"error,omitempty"`
}

// Crash is one crash of the relay the tester caused: SIGKILL, then a
// restart on the same data and port.
type Crash struct {
	// AtSeconds is the kill, after the first scheduled send.
	AtSeconds float64 `json:"at_seconds"`
	// Replicas are the relays killed (0-based).
	Replicas []int `json:"replicas"`
	// DownMS is from the kill to the first 200 from /ready of the
	// restarted relay (the slowest, when several were killed).
	DownMS float64 `json:"down_ms"`
	// AcksAtRisk are the acknowledgements the relay answered within its
	// ack interval before the kill (-ack explicit): the ones a crash may
	// lose.
	AcksAtRisk int `json:"acks_at_risk,omitempty"`
	// Error says why the relay did not come back, if it did not.
	Error string `json:"error,omitempty"`
}

// Steady is sampled every second over the second half of the offered
// window, when every poll of the run is long held: medians, so that a
// garbage collection does not decide the figure.
type Steady struct {
	FromSeconds float64 `json:"from_seconds"` // after the first scheduled send
	ToSeconds   float64 `json:"to_seconds"`
	Samples     int     `json:"samples"`
	// HeldPolls is the tester's count of polls in flight.
	HeldPolls int `json:"held_polls"`
	// RSSBytes is the relay processes' resident memory, summed.
	RSSBytes int64 `json:"rss_bytes"`
}

// Hostile is what the hostile connections sent and what came back.
type Hostile struct {
	Connections int `json:"connections"`
	Requests    int `json:"requests"`
	// Outcomes counts each kind of request by what the relay did:
	// "<status>" or "<status> <limit>", "+closed" when it closed the
	// connection, "no answer" when it only closed it.
	Outcomes map[string]map[string]int `json:"outcomes"`
	// Failures are outcomes that fail the run, by "<kind>: <what>": a 5xx
	// other than 503, a hostile request accepted, a connection the relay
	// did not close within CloseLimitSeconds.
	Failures map[string]int `json:"failures,omitempty"`
	// CloseLimitSeconds is how long the relay had to close a connection
	// whose request never finished: its body timeout plus slack.
	CloseLimitSeconds float64 `json:"close_limit_seconds"`
	// SlowReaders is how many connections of one device token each round
	// of the slow readers opened: each polls with about 2 MiB waiting and
	// reads nothing until SlowReaderLimitSeconds after its poll (the
	// relay's answer timeout plus the answer's size at its minimum rate,
	// plus slack), by when the relay must have refused or cut the answer.
	SlowReaders            int     `json:"slow_readers,omitempty"`
	SlowReaderRounds       int     `json:"slow_reader_rounds,omitempty"`
	SlowReaderConnections  int     `json:"slow_reader_connections,omitempty"`
	SlowReaderLimitSeconds float64 `json:"slow_reader_limit_seconds,omitempty"`
	// TCPMemory is the machine's kernel TCP buffer memory (every socket's,
	// the tester's too) as the slow readers began, and its peak while
	// they ran.
	TCPMemoryStartBytes int64 `json:"tcp_memory_start_bytes,omitempty"`
	TCPMemoryPeakBytes  int64 `json:"tcp_memory_peak_bytes,omitempty"`
}

// Renewals is what the renewers asked and got: devices paired before the
// run, each renewing every EverySeconds. FloodRequests is how many hostile
// requests went to the pairing endpoints meanwhile, FloodPerSecond their
// rate over the run's window.
type Renewals struct {
	Renewers       int            `json:"renewers"`
	EverySeconds   float64        `json:"every_seconds"`
	Attempted      int            `json:"attempted"`
	Succeeded      int            `json:"succeeded"`
	Refused        map[string]int `json:"refused"`
	FloodRequests  int            `json:"flood_requests"`
	FloodPerSecond float64        `json:"flood_per_second"`
}

// Memory is the memory cap the relays ran under.
type Memory struct {
	LimitBytes int64 `json:"limit_bytes"`
	// Enforced is how: "cgroup v2", "cgroup v1", or "rlimit as" (address
	// space, a weak fallback).
	Enforced string `json:"enforced"`
	// AppliedBytes is the limit read back from the kernel for the running
	// relay (the cgroup's limit, or its address-space limit).
	AppliedBytes int64  `json:"applied_bytes"`
	GoMemLimit   string `json:"gomemlimit"`
	Warning      string `json:"warning,omitempty"`
	// PeakRSSBytes is the highest peak (VmHWM) of any relay process.
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	// CgroupPeakBytes is the cgroup's own peak, page cache included.
	CgroupPeakBytes int64 `json:"cgroup_peak_bytes,omitempty"`
	OOMKills        int   `json:"oom_kills"`
	OOMKilled       bool  `json:"oom_killed"`
}

// Redis is Redis's connected_clients (INFO clients), sampled every second
// while the relays ran. Other users of the same server count too, so the
// figure before the relays started is the baseline.
type Redis struct {
	ClientsBefore int `json:"connected_clients_before"`
	ClientsMedian int `json:"connected_clients_median"`
	ClientsPeak   int `json:"connected_clients_peak"`
	Samples       int `json:"samples"`
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
	// EphemeralPorts is the kernel's local port range, "32768-60999".
	EphemeralPorts string `json:"ephemeral_ports,omitempty"`
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

	// AckMode is "cursor" or "explicit"; absent in older reports, which
	// all acknowledged by cursor.
	AckMode string `json:"ack_mode,omitempty"`
	// Transport is "stream" when recipients held streams; absent, polls.
	Transport string `json:"transport,omitempty"`
	// Hop is the chance that a recipient's next poll or stream goes to
	// another relay than its last (-hop); absent, none.
	Hop            float64   `json:"hop,omitempty"`
	CrashAtSeconds []float64 `json:"crash_at_seconds,omitempty"`
	// CrashReplica is the replica -crash killed, "all" for every one.
	CrashReplica string `json:"crash_replica,omitempty"`
	// CrashDownSeconds is how long a killed relay stayed down before its
	// restart began.
	CrashDownSeconds float64 `json:"crash_down_seconds,omitempty"`
	Hostile          int     `json:"hostile,omitempty"`
	SlowReaders      int     `json:"slow_readers,omitempty"`
	// HostileKinds is the kinds the hostile connections sent, when not
	// all of them ("pairing": only those against the pairing endpoints).
	HostileKinds     string   `json:"hostile_kinds,omitempty"`
	Renewers         int      `json:"renewers,omitempty"`
	RelayMemoryBytes int64    `json:"relay_memory_bytes,omitempty"`
	RelayEnv         []string `json:"relay_env,omitempty"`
	// SourceAddresses is how many loopback source addresses the pairs'
	// connections were spread over.
	SourceAddresses int `json:"source_addresses,omitempty"`
	// Faults is a fault campaign's seed; FaultKinds the kinds it drew
	// from, FaultGapSeconds the mean time between faults.
	Faults          string   `json:"faults,omitempty"`
	FaultKinds      []string `json:"fault_kinds,omitempty"`
	FaultGapSeconds float64  `json:"fault_gap_seconds,omitempty"`
	// Failover is the formation's replication ("sync" or "async") of a
	// -failover run, which kills the Postgres primary mid-run.
	Failover string `json:"failover,omitempty"`
}

// Plain reports whether c is an ordinary run: no crash, failover or fault campaign,
// no hostile load, no memory cap, no relay settings changed,
// acknowledgements by cursor. Only plain runs stand beside each other in
// the comparison tables.
func (c Config) Plain() bool {
	return len(c.CrashAtSeconds) == 0 && c.Faults == "" && c.Failover == "" && c.Hostile == 0 && c.Renewers == 0 && c.RelayMemoryBytes == 0 &&
		len(c.RelayEnv) == 0 && (c.AckMode == "" || c.AckMode == "cursor")
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
	// Git is the commit the relay binary the tester started was built
	// from, when -relay-commit says it is another than the report's own.
	Git *Git `json:"git,omitempty"`
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
	if r.Redelivered > 0 {
		fmt.Fprintf(&b, " redelivered=%d", r.Redelivered)
	}
	if r.CursorAhead > 0 || r.Resyncs > 0 {
		fmt.Fprintf(&b, " cursor_ahead=%d resyncs=%d", r.CursorAhead, r.Resyncs)
	}
	if len(r.Crashes) > 0 {
		fmt.Fprintf(&b, " crashes=%d", len(r.Crashes))
	}
	if f := r.Failover; f != nil {
		fmt.Fprintf(&b, " failover=%s promoted=%s first_delivery=%s sends_refused=%d",
			f.Mode, FormatMS(f.PromotedMS), FormatMS(f.FirstDeliveryMS), sum(f.SendsRefused))
	}
	if c := r.Campaign; c != nil {
		fmt.Fprintf(&b, " seed=%s faults=%d removals=%d owed=%d excused=%d violations=%d",
			c.Seed, len(c.Faults), c.Removals, c.Owed, c.Excused, sum(c.Violations))
	}
	if h := r.Hostile; h != nil {
		fmt.Fprintf(&b, " hostile=%d requests, %d failed", h.Requests, sum(h.Failures))
	}
	if rn := r.Renewals; rn != nil {
		fmt.Fprintf(&b, " renewals=%d attempted, %d succeeded, %d refused (pairing flood %.1f/s)", rn.Attempted, rn.Succeeded, sum(rn.Refused), rn.FloodPerSecond)
	}
	fmt.Fprintf(&b, " accepted->returned p50=%s p95=%s p99=%s max=%s",
		FormatMS(l.P50), FormatMS(l.P95), FormatMS(l.P99), FormatMS(l.Max))
	if r.Relay.Source != "" {
		fmt.Fprintf(&b, " relay cpu=%.1fs (%.2f cores) rss=%s",
			r.Relay.CPUSeconds, Cores(r), FormatBytes(r.Relay.PeakRSSBytes))
	}
	if m := r.Memory; m != nil {
		fmt.Fprintf(&b, " cap=%s (%s) oom_killed=%v", FormatBytes(m.LimitBytes), m.Enforced, m.OOMKilled)
	}
	return b.String()
}

// WakeLines are the human-readable lines of r's Wakes, one per relay,
// printed after the summary line; none without them. Absent values are
// left out.
func (r *Report) WakeLines() []string {
	var lines []string
	for _, w := range r.Wakes {
		var b strings.Builder
		fmt.Fprintf(&b, "relay %d: wakes", w.Relay)
		for _, f := range []struct {
			name string
			v    *float64
		}{
			{"received", w.Received}, {"unheld", w.Unheld}, {"subscriptions", w.SubscriptionsEnd},
			{"subscribes", w.Subscribes}, {"subscribe_commands", w.SubscribeCommands},
			{"unsubscribes", w.Unsubscribes}, {"unsubscribe_commands", w.UnsubscribeCommands},
			{"held_polls", w.HeldPollsEnd},
		} {
			if f.v != nil {
				fmt.Fprintf(&b, " %s=%s", f.name, strconv.FormatFloat(*f.v, 'f', -1, 64))
			}
		}
		lines = append(lines, b.String())
	}
	return lines
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
