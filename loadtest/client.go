package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// maxBody bounds what the tester reads from one response: a poll answers
// at most 2 MiB of payload, so this is far above any honest answer.
const maxBody = 64 << 20

// api speaks the relay protocol (docs/PROTOCOL.md) to one relay over HTTP.
type api struct {
	base    string
	relay   int // its index among the targets
	hc      *http.Client
	msgpack bool
}

type sendRequest struct {
	ID      string   `json:"id" msgpack:"id"`
	To      []string `json:"to" msgpack:"to"`
	Payload []byte   `json:"payload" msgpack:"payload"`
}

type delivery struct {
	Device string `json:"device" msgpack:"device"`
	Seq    int64  `json:"seq" msgpack:"seq"`
}

type sendResponse struct {
	ID         string     `json:"id" msgpack:"id"`
	Deliveries []delivery `json:"deliveries" msgpack:"deliveries"`
}

// envelope leaves out sent_at: the tester keeps its own clock, and
// MessagePack may carry the time as an extension type.
type envelope struct {
	Seq     int64  `json:"seq" msgpack:"seq"`
	ID      string `json:"id" msgpack:"id"`
	From    string `json:"from" msgpack:"from"`
	Payload []byte `json:"payload" msgpack:"payload"`
}

type pollResponse struct {
	Cursor    int64      `json:"cursor" msgpack:"cursor"`
	More      bool       `json:"more" msgpack:"more"`
	Envelopes []envelope `json:"envelopes" msgpack:"envelopes"`
}

type registerResponse struct {
	Household string `json:"household" msgpack:"household"`
	Device    string `json:"device" msgpack:"device"`
	Cursor    int64  `json:"cursor" msgpack:"cursor"`
}

// statusError is an answer other than the one expected.
type statusError struct {
	Status     int
	Code       string
	Message    string
	Head       int64
	Limit      string // which limit refused a 429
	RetryAfter time.Duration
}

func (e *statusError) Error() string {
	return fmt.Sprintf("relay answered %d %s: %s", e.Status, e.Code, e.Message)
}

// kind names the error for counting: "<status> <code>", and the limit
// that refused it in parentheses when the relay names one.
func (e *statusError) kind() string {
	k := strconv.Itoa(e.Status)
	if e.Code != "" {
		k += " " + e.Code
	}
	if e.Limit != "" {
		k += " (" + e.Limit + ")"
	}
	return k
}

// refused reports whether the relay turned the request away by admission
// (429 or 503), which a client retries later rather than counts as a fault.
func (e *statusError) refused() bool {
	return e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable
}

type errorBody struct {
	Error   string `json:"error" msgpack:"error"`
	Message string `json:"message" msgpack:"message"`
	Head    int64  `json:"head" msgpack:"head"`
	Limit   string `json:"limit" msgpack:"limit"`
}

func (a *api) register(ctx context.Context, tok string) (registerResponse, error) {
	var out registerResponse
	err := a.do(ctx, http.MethodPost, "/v1/register", tok, struct{}{}, http.StatusOK, &out)
	return out, err
}

func (a *api) send(ctx context.Context, tok string, req sendRequest) (sendResponse, error) {
	var out sendResponse
	err := a.do(ctx, http.MethodPost, "/v1/send", tok, req, http.StatusAccepted, &out)
	return out, err
}

// poll asks for what is above cursor; a negative cursor leaves it out, so
// the relay answers from the cursor it has stored.
func (a *api) poll(ctx context.Context, tok string, cursor int64, wait int) (pollResponse, error) {
	var out pollResponse
	path := "/v1/poll?wait=" + strconv.Itoa(wait)
	if cursor >= 0 {
		path += "&cursor=" + strconv.FormatInt(cursor, 10)
	}
	err := a.do(ctx, http.MethodGet, path, tok, nil, http.StatusOK, &out)
	return out, err
}

type ackRequest struct {
	Cursor int64 `json:"cursor" msgpack:"cursor"`
}

// ack acknowledges everything up to cursor, as POST /v1/ack.
func (a *api) ack(ctx context.Context, tok string, cursor int64) error {
	return a.do(ctx, http.MethodPost, "/v1/ack", tok, ackRequest{Cursor: cursor}, http.StatusNoContent, nil)
}

func (a *api) do(ctx context.Context, method, path, tok string, in any, want int, out any) error {
	var body io.Reader
	if in != nil {
		b, err := a.marshal(in)
		if err != nil {
			return fmt.Errorf("encode %s: %w", path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if a.msgpack {
		req.Header.Set("Accept", "application/msgpack")
		if in != nil {
			req.Header.Set("Content-Type", "application/msgpack")
		}
	} else if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("%s %s: read body: %w", method, path, err)
	}
	if resp.StatusCode != want {
		return a.statusError(resp, b)
	}
	if out == nil {
		return nil
	}
	if err := a.unmarshal(resp.Header.Get("Content-Type"), b, out); err != nil {
		return fmt.Errorf("%s %s: decode: %w", method, path, err)
	}
	return nil
}

func (a *api) statusError(resp *http.Response, b []byte) error {
	e := &statusError{Status: resp.StatusCode}
	var eb errorBody
	if a.unmarshal(resp.Header.Get("Content-Type"), b, &eb) == nil {
		e.Code, e.Message, e.Head, e.Limit = eb.Error, eb.Message, eb.Head, eb.Limit
	}
	if s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && s >= 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	return e
}

func (a *api) marshal(v any) ([]byte, error) {
	if a.msgpack {
		return msgpack.Marshal(v)
	}
	return json.Marshal(v)
}

// unmarshal decodes by the answer's own Content-Type, so an error body
// written in JSON to a MessagePack client still reads.
func (a *api) unmarshal(contentType string, b []byte, v any) error {
	if strings.HasPrefix(contentType, "application/msgpack") {
		return msgpack.Unmarshal(b, v)
	}
	return json.Unmarshal(b, v)
}

// retryable reports whether a careful client sends the same request again:
// no answer came (the relay may or may not have done it), or a 503 said to
// come back. Every other answer is definitive.
func retryable(err error) bool {
	var se *statusError
	if errors.As(err, &se) {
		return se.Status == http.StatusServiceUnavailable
	}
	return err != nil
}

// errKind names a request error for counting.
func errKind(op string, err error) string {
	var se *statusError
	if errors.As(err, &se) {
		return op + " " + se.kind()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return op + " timeout"
	}
	return op + " transport"
}

// newTransport gives every held poll and every in-flight send its own
// connection: conns is their sum plus slack. With sources above 1 the
// connections are spread over that many loopback source addresses
// (127.0.0.1, .2, ...), each with its own ephemeral ports.
func newTransport(conns, sources int) *http.Transport {
	return &http.Transport{
		Proxy:               nil, // loopback targets; an environment proxy would skew every figure
		DialContext:         sourceDialer(sources),
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
}

// sourceDialer dials from the loopback source addresses round-robin.
func sourceDialer(sources int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	base := net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if sources <= 1 {
		return base.DialContext
	}
	var next atomic.Uint32
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := base
		d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+next.Add(1)%uint32(sources)))}
		return d.DialContext(ctx, network, addr)
	}
}
