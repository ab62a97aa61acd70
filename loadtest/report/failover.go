package report

// Failover is a -failover run's loss of the Postgres primary: a
// pg_auto_failover formation (a monitor, a primary and a standby) that the
// tester started, whose primary it killed mid-run (keeper and Postgres,
// SIGKILL) for the monitor to promote the standby.
type Failover struct {
	// Mode is the formation's replication: "sync" (a commit is answered
	// once the standby has it) or "async".
	Mode string `json:"mode"`
	// AtSeconds is the kill, after the first scheduled send.
	AtSeconds float64 `json:"at_seconds"`
	// CutMS is, in async, how long the primary's WAL sender was stopped
	// before the kill: what it committed meanwhile was on it alone.
	CutMS float64 `json:"cut_ms,omitempty"`
	// PromotedMS is from the kill until the monitor had promoted the
	// standby and it took writes.
	PromotedMS float64 `json:"promoted_ms"`
	// FirstDeliveryMS is from the kill to the first delivery of a send
	// first tried after it: when deliveries had resumed.
	FirstDeliveryMS float64 `json:"first_delivery_ms"`
	// SendsRefused are send attempts that failed while no primary took
	// writes (from the kill until two seconds after the promotion), by
	// kind: 503s and requests without an answer, which their senders
	// tried again with the same id, and 429s (sends in flight at the
	// relay's limit while store calls waited), which they did not.
	SendsRefused map[string]int `json:"sends_refused"`
	// Primary and Promoted name the killed node and the promoted one.
	Primary  string `json:"primary"`
	Promoted string `json:"promoted"`
	// Error says what went wrong with the failover itself, if anything.
	Error string `json:"error,omitempty"`
}
