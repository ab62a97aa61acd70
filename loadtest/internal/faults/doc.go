// Package faults inflicts the faults a run asks for while its load goes
// on, and records each: -crash's kills and restarts of relays,
// -failover's loss of the Postgres primary, and -faults' campaign drawn
// from a seed (relays, Postgres and Redis killed and paused, recipients
// removed and registered again, clients crashed), with the campaign's own
// checks of what a removal promises.
package faults
