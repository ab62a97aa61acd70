package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/flamenet/relay/internal/wire"
	"github.com/flamenet/relay/store"
)

// Error codes of the protocol (docs/PROTOCOL.md).
const (
	codeBadRequest      = "bad_request"
	codeUnauthorized    = "unauthorized"
	codeForbidden       = "forbidden"
	codeNotFound        = "not_found"
	codeUnknownDevice   = "unknown_device"
	codePayloadTooLarge = "payload_too_large"
	codeIDConflict      = "id_conflict"
	codeQueueFull       = "queue_full"
	codeRateLimited     = "rate_limited"
	codeAnswersInFlight = "answers_in_flight"
	codeOverloaded      = "overloaded"
	codeCursorAhead     = "cursor_ahead"
	codeUnavailable     = "unavailable"
	codeInternal        = "internal"
	codeDeviceExists    = "device_exists"
	codeUnsupportedType = "unsupported_media_type"
)

// httpError is an error with the answer the client gets. Message is for the
// client; Cause is for the log only.
type httpError struct {
	Status  int
	Code    string
	Message string
	Head    *int64 // cursor_ahead only
	Epoch   string // cursor_ahead only: the store's epoch head is of
	Limit   string // 429 only: which limit refused (limitSendRate, ...)
	// RetryAfter, when above zero, is the Retry-After a 429 or 503 says
	// (rounded up to whole seconds); zero: a short jittered wait.
	RetryAfter time.Duration
	Cause      error
	// Logged: what it says was logged once where it was found (a change
	// of readiness), so it is not logged again at every request.
	Logged bool
}

func (e *httpError) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("%d %s: %s: %v", e.Status, e.Code, e.Message, e.Cause)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

func (e *httpError) Unwrap() error { return e.Cause }

func errorf(status int, code, format string, args ...any) *httpError {
	return &httpError{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) *httpError {
	return errorf(http.StatusBadRequest, codeBadRequest, format, args...)
}

var (
	errUnauthorized = &httpError{Status: http.StatusUnauthorized, Code: codeUnauthorized, Message: "The token is missing or not valid."}
	errDraining     = &httpError{Status: http.StatusServiceUnavailable, Code: codeUnavailable, Message: "The relay is shutting down; try again."}
)

// errorBody is the protocol's error shape, in JSON and MessagePack alike.
type errorBody struct {
	Error   string `json:"error" msgpack:"error"`
	Message string `json:"message" msgpack:"message"`
	Head    *int64 `json:"head,omitempty" msgpack:"head,omitempty"`
	Epoch   string `json:"epoch,omitempty" msgpack:"epoch,omitempty"`
	Limit   string `json:"limit,omitempty" msgpack:"limit,omitempty"`
}

// fromStore turns a store error into the client's answer.
func fromStore(err error) *httpError {
	var he *httpError
	var ahead *store.CursorAheadError
	var stale *store.StaleEpochError
	var unknown *store.UnknownDeviceError
	switch {
	case errors.As(err, &he):
		return he
	case errors.As(err, &ahead):
		head := ahead.Head
		return &httpError{Status: http.StatusConflict, Code: codeCursorAhead, Message: "The cursor is above the highest seq this device was given.", Head: &head, Cause: err}
	case errors.As(err, &stale):
		return &httpError{Status: http.StatusConflict, Code: codeCursorAhead, Message: "The cursor is of another epoch of the store (its history went back): poll without cursor and epoch to resynchronise.", Epoch: stale.Epoch, Cause: err}
	case errors.As(err, &unknown):
		return &httpError{Status: http.StatusNotFound, Code: codeUnknownDevice, Message: fmt.Sprintf("Device %q is not registered in this household.", unknown.Device), Cause: err}
	case errors.Is(err, store.ErrUnknownDevice):
		return &httpError{Status: http.StatusNotFound, Code: codeUnknownDevice, Message: "A recipient is not registered in this household.", Cause: err}
	case errors.Is(err, store.ErrConflict):
		return &httpError{Status: http.StatusConflict, Code: codeIDConflict, Message: "This send id was used with other recipients or another payload.", Cause: err}
	case errors.Is(err, store.ErrQueueFull):
		return &httpError{Status: http.StatusTooManyRequests, Code: codeQueueFull, Limit: limitDevicePending, Message: "A recipient has too many envelopes waiting.", Cause: err}
	case errors.Is(err, store.ErrHouseholdFull):
		return &httpError{Status: http.StatusTooManyRequests, Code: codeQueueFull, Limit: limitHouseholdPending, Message: "This household's devices have too many bytes waiting.", Cause: err}
	case errors.Is(err, store.ErrNotFound):
		return &httpError{Status: http.StatusNotFound, Code: codeNotFound, Message: "No such device.", Cause: err}
	case errors.Is(err, store.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return &httpError{Status: http.StatusServiceUnavailable, Code: codeUnavailable, Message: "The store is unavailable; try again.", Cause: err}
	}
	var we *wire.Error
	if errors.As(err, &we) {
		return &httpError{Status: we.Status, Code: wireCodes[we.Status], Message: we.Message, Limit: we.Limit, RetryAfter: we.RetryAfter}
	}
	return &httpError{Status: http.StatusInternalServerError, Code: codeInternal, Message: "Internal error.", Cause: err}
}

// wireCodes are the error codes of the statuses a wire.Error has.
var wireCodes = map[int]string{
	http.StatusBadRequest: codeBadRequest, http.StatusUnauthorized: codeUnauthorized, http.StatusForbidden: codeForbidden,
	http.StatusNotFound: codeNotFound, http.StatusRequestEntityTooLarge: codePayloadTooLarge, http.StatusTooManyRequests: codeRateLimited,
	http.StatusConflict: codeDeviceExists, http.StatusUnsupportedMediaType: codeUnsupportedType,
}

// retryAfter is a jittered number of whole seconds, so that refused clients
// do not all come back in the same second.
func retryAfter(status int) string {
	base := 1
	if status == http.StatusServiceUnavailable {
		base = 2
	}
	return strconv.Itoa(base + rand.IntN(4))
}

// writeError answers with the protocol's error body and logs the cause. A
// request whose client has gone is not logged as an error.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	s.storeFailed(err)
	he := fromStore(err)
	notePoll(r.Context(), errorOutcome(he, r.Context().Err() != nil))
	if rec := recordOf(r.Context()); rec != nil {
		rec.code = he.Code
	}
	if he.Status == http.StatusTooManyRequests || he.Status == http.StatusServiceUnavailable {
		ra := retryAfter(he.Status)
		if he.RetryAfter > 0 {
			ra = strconv.FormatInt(int64((he.RetryAfter+time.Second-1)/time.Second), 10)
		}
		w.Header().Set("Retry-After", ra)
	}
	if he.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="relay"`)
	}
	switch {
	case r.Context().Err() != nil, he.Logged:
	case he.Status >= 500:
		s.log.LogAttrs(r.Context(), slog.LevelError, "request failed", slog.String("path", r.URL.Path), slog.Int("status", he.Status), slog.Any("err", he))
	case he.Cause != nil:
		s.log.LogAttrs(r.Context(), slog.LevelDebug, "request refused", slog.String("path", r.URL.Path), slog.Int("status", he.Status), slog.Any("err", he))
	}
	writeBody(w, r, he.Status, errorBody{Error: he.Code, Message: he.Message, Head: he.Head, Epoch: he.Epoch, Limit: he.Limit})
}

// storeFailed nudges the store watch after a store call that found the
// store unavailable: it may be another store by now (a failover).
func (s *Server) storeFailed(err error) {
	if errors.Is(err, store.ErrUnavailable) && s.watch != nil {
		s.watch.Nudge()
	}
}
