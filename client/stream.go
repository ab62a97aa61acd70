package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"
)

// ErrStreamUnavailable means the relay (or a proxy in front of it) does not
// stream: GET /v1/stream is not served, its answer is not an event
// stream, or its first event did not come within 10 s (a
// proxy that buffers answers). Listen then polls, and tries a stream again
// later.
var ErrStreamUnavailable = errors.New("client: the relay's stream is not available here")

// ErrStreamCut means the stream's answer ended without its last event, or
// carried nothing (not even a ping) for a minute: the relay
// restarted, a proxy or NAT dropped the connection, or the client stopped
// reading. Nothing is lost: the next stream starts from the cursor.
var ErrStreamCut = errors.New("client: the stream was cut")

// Variables only for tests.
var (
	// streamReadyTimeout bounds the wait for a stream's first event,
	// which the relay writes with the answer's head.
	streamReadyTimeout = 10 * time.Second
	// streamIdleTimeout is how long a stream may carry nothing: the relay
	// pings every 15 to 25 s.
	streamIdleTimeout = 60 * time.Second
)

// StreamQuery is a stream's parameters, as a poll's.
type StreamQuery struct {
	// Cursor acknowledges everything at or below it; the stream carries
	// what is above.
	Cursor int64
	// OmitCursor leaves the cursor out: the stream starts above the
	// cursor the relay knows.
	OmitCursor bool
	// Epoch is the store epoch Cursor was taken in ("": not checked).
	Epoch string
}

// Stream is an open GET /v1/stream: Next reads its events one at a time.
// It is not safe for concurrent use.
type Stream struct {
	body     io.ReadCloser
	rd       *bufio.Reader
	cancel   context.CancelFunc
	idle     *time.Timer
	ready    bool
	ended    bool
	timedOut atomic.Bool
}

// StreamEvent is one event of a stream.
type StreamEvent struct {
	// Kind is "ready" (the first: Result has the position the stream
	// starts at), "envelopes" (Result is what a poll would have answered),
	// "ping" (a keep-alive) or "end" (the last: End says why).
	Kind   string
	Result PollResult
	End    *StreamEnd
}

// StreamEnd is why a stream ended.
type StreamEnd struct {
	// Reason is "superseded" (a newer stream or poll of the device),
	// "drained" (the relay is shutting down), "expired" (the stream's life
	// ran out: open the next at once), "removed" or "error".
	Reason string
	// Err is the refusal, for removed and error: what the request would
	// have been answered (a 409 cursor_ahead after a new store epoch, a
	// 401 for a removed device, a 503).
	Err *Error
}

type streamEndBody struct {
	Reason  string `json:"reason"`
	Status  int    `json:"status"`
	Error   string `json:"error"`
	Message string `json:"message"`
	Head    int64  `json:"head"`
	Epoch   string `json:"epoch"`
	Limit   string `json:"limit"`
}

// Stream opens a stream. It fails as a poll does (a *Error, with one
// renewal of refused credentials first), or with ErrStreamUnavailable.
// The stream is not bounded by the client's request timeout; an HTTP
// client with a Timeout of its own (WithHTTPClient) cuts it there.
func (c *Client) Stream(ctx context.Context, q StreamQuery) (*Stream, error) {
	v := url.Values{}
	if !q.OmitCursor {
		v.Set("cursor", strconv.FormatInt(q.Cursor, 10))
	}
	if q.Epoch != "" {
		v.Set("epoch", q.Epoch)
	}
	path := "/v1/stream"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	tok, err := c.creds.Token(ctx)
	if err != nil {
		if errors.Is(err, ErrUnauthorized) {
			c.state(State{Kind: StateUnauthorized, Err: err})
		}
		return nil, err
	}
	s, err := c.openStream(ctx, tok, path)
	var e *Error
	if errors.As(err, &e) && e.Status == http.StatusUnauthorized {
		fresh, rerr := c.creds.Refused(ctx, tok)
		switch {
		case errors.Is(rerr, ErrUnauthorized):
			c.state(State{Kind: StateUnauthorized, Err: err})
			return nil, &refusedError{relay: e, why: rerr}
		case rerr != nil:
			return nil, rerr
		}
		s, err = c.openStream(ctx, fresh, path)
		if errors.As(err, &e) && e.Status == http.StatusUnauthorized {
			c.state(State{Kind: StateUnauthorized, Err: err})
			return nil, &refusedError{relay: e, why: ErrUnauthorized}
		}
	}
	return s, err
}

func (c *Client) openStream(ctx context.Context, tok, path string) (*Stream, error) {
	sctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(sctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("client: GET %s: %w", path, err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Accept", "text/event-stream")
	s := &Stream{cancel: cancel}
	// The head and the first event come together: a relay (or proxy)
	// that sends neither in time is not streaming.
	s.idle = time.AfterFunc(streamReadyTimeout, func() { s.timedOut.Store(true); cancel() })
	resp, err := c.hc.Do(req)
	if err != nil {
		s.idle.Stop()
		cancel()
		if s.timedOut.Load() && ctx.Err() == nil {
			return nil, fmt.Errorf("%w: no answer in %v", ErrStreamUnavailable, streamReadyTimeout)
		}
		return nil, fmt.Errorf("client: GET %s: %w", path, err)
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if resp.StatusCode != http.StatusOK || mt != "text/event-stream" {
		s.idle.Stop()
		defer cancel()
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		switch {
		case resp.StatusCode == http.StatusNotFound, resp.StatusCode == http.StatusMethodNotAllowed,
			resp.StatusCode == http.StatusOK:
			// An older relay, or something in between that answers for it.
			return nil, fmt.Errorf("%w: %s %s", ErrStreamUnavailable, resp.Status, mt)
		}
		return nil, answerError(resp, codecFor(resp.Header.Get("Content-Type")), b)
	}
	s.body = resp.Body
	s.rd = bufio.NewReaderSize(resp.Body, 64<<10)
	return s, nil
}

// Close ends the stream.
func (s *Stream) Close() {
	s.idle.Stop()
	s.cancel()
	if s.body != nil {
		s.body.Close()
	}
}

// Next reads the next event. After the end event it returns io.EOF; a
// stream that ends without one, or stays silent too long, ErrStreamCut;
// one whose first event does not come in time, ErrStreamUnavailable.
func (s *Stream) Next() (StreamEvent, error) {
	if s.ended {
		return StreamEvent{}, io.EOF
	}
	var name, data []byte
	for {
		line, err := s.rd.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A long data line (a batch of up to 2 MiB of payload).
			full := append([]byte(nil), line...)
			for err == bufio.ErrBufferFull {
				line, err = s.rd.ReadSlice('\n')
				full = append(full, line...)
			}
			line = full
		}
		if err != nil {
			if s.timedOut.Load() && !s.ready {
				return StreamEvent{}, fmt.Errorf("%w: no event in %v", ErrStreamUnavailable, streamReadyTimeout)
			}
			return StreamEvent{}, fmt.Errorf("%w: %w", ErrStreamCut, err)
		}
		s.idle.Reset(streamIdleTimeout)
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			if name == nil {
				continue
			}
			return s.event(string(name), data)
		case line[0] == ':':
			if s.ready {
				return StreamEvent{Kind: "ping"}, nil
			}
		case bytes.HasPrefix(line, []byte("event: ")):
			name = append(name[:0], line[len("event: "):]...)
		case bytes.HasPrefix(line, []byte("data: ")):
			data = append(data[:0], line[len("data: "):]...)
		}
		// id: lines, and fields this client does not know, are skipped:
		// the id is the batch's cursor, which its data carries too.
	}
}

func (s *Stream) event(name string, data []byte) (StreamEvent, error) {
	ev := StreamEvent{Kind: name}
	switch name {
	case "ready", "envelopes":
		if err := json.Unmarshal(data, &ev.Result); err != nil {
			return ev, fmt.Errorf("client: stream: decoding %s: %w", name, err)
		}
		s.ready = true
	case "end":
		var b streamEndBody
		if err := json.Unmarshal(data, &b); err != nil {
			return ev, fmt.Errorf("client: stream: decoding its end: %w", err)
		}
		ev.End = &StreamEnd{Reason: b.Reason}
		if b.Status != 0 {
			ev.End.Err = &Error{Status: b.Status, Code: b.Error, Message: b.Message, Head: b.Head, Epoch: b.Epoch, Limit: b.Limit}
		}
		s.ended = true
	}
	return ev, nil
}
