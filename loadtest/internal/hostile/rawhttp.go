package hostile

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// rawConn is one TCP connection spoken to by hand: net/http would finish a
// body it was told to send, refuse to declare one it does not send, and
// hide whether the server closed the connection.
type rawConn struct {
	c    net.Conn
	br   *bufio.Reader
	stop func() bool
}

// dialRaw connects to addr from local (nil: any). The connection closes
// when ctx ends, so nothing blocks past it.
func dialRaw(ctx context.Context, addr string, local net.Addr) (*rawConn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if local != nil {
		d.LocalAddr = local
	}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &rawConn{c: c, br: bufio.NewReader(c), stop: context.AfterFunc(ctx, func() { _ = c.Close() })}, nil
}

func (rc *rawConn) close() {
	rc.stop()
	_ = rc.c.Close()
}

func (rc *rawConn) write(b []byte, deadline time.Time) error {
	_ = rc.c.SetWriteDeadline(deadline)
	_, err := rc.c.Write(b)
	return err
}

// readResponse reads one response and up to 1 MiB of its body.
func (rc *rawConn) readResponse(deadline time.Time) (*http.Response, []byte, error) {
	_ = rc.c.SetReadDeadline(deadline)
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp, body, err
}

// roundTrip writes req and reads the answer. A relay may answer before it
// has read the whole request, and close: a failed write still looks for
// that answer.
func (rc *rawConn) roundTrip(req []byte, deadline time.Time) (*http.Response, []byte, error) {
	werr := rc.write(req, deadline)
	resp, body, err := rc.readResponse(deadline)
	if err != nil && werr != nil {
		return nil, nil, fmt.Errorf("write: %w", werr)
	}
	return resp, body, err
}

// awaitClose reads until the server closes the connection (true) or the
// deadline passes (false). Whatever arrives meanwhile is discarded.
func (rc *rawConn) awaitClose(deadline time.Time) bool {
	_ = rc.c.SetReadDeadline(deadline)
	_, err := io.Copy(io.Discard, rc.br)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// rawRequest is a request with its headers; a non-nil body gets its
// Content-Length unless a header says otherwise.
func rawRequest(method, path string, headers []string, body []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: relay\r\n", method, path)
	declared := false
	for _, h := range headers {
		if h == "" {
			continue
		}
		b.WriteString(h + "\r\n")
		if bytes.HasPrefix(bytes.ToLower([]byte(h)), []byte("content-length:")) ||
			bytes.HasPrefix(bytes.ToLower([]byte(h)), []byte("transfer-encoding:")) {
			declared = true
		}
	}
	if body != nil && !declared {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.Write(body)
	return b.Bytes()
}
