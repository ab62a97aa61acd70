// Package wire is the API's form on the wire, shared by the packages that
// serve it (relay, pairing): times, and refusals as the client is told
// them.
package wire

import (
	"fmt"
	"time"
)

// Timestamp returns the wire form of a time: RFC 3339 in UTC with microseconds.
func Timestamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05.000000Z")
}

// Error is a request refused with a 4xx, and what its client is told. The
// relay answers it in the protocol's error body, with the error code of its
// status (relay/errors.go).
type Error struct {
	Status  int
	Message string
	// Limit is which limit refused a 429, in the body's "limit" field.
	Limit string
	// RetryAfter, above zero, is the Retry-After a 429 says.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Message) }

// Errorf returns an Error of status with a formatted message.
func Errorf(status int, format string, args ...any) *Error {
	return &Error{Status: status, Message: fmt.Sprintf(format, args...)}
}
