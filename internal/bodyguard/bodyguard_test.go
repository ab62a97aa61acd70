package bodyguard

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// limited answers 413 once a body passes 1 KiB, reading no further.
var limited = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if _, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<10)); err != nil {
		http.Error(w, "too large", http.StatusRequestEntityTooLarge)
		return
	}
	w.WriteHeader(http.StatusNoContent)
})

// raw sends head and body on a connection of its own and returns the
// answer's status, and whether the connection then ended cleanly (EOF, not
// a reset).
func raw(t *testing.T, addr, head, body string) (int, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, head+"\r\nHost: x\r\n\r\n"+body); err != nil {
		return 0, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_, err = io.Copy(io.Discard, br)
	return resp.StatusCode, err
}

// TestOversizedBodyGets413: a client that sends a whole body over the
// handler's limit reads its 413 and then the connection's end, not a
// reset (which, sent with the body unread, can destroy the 413 first).
func TestOversizedBodyGets413(t *testing.T) {
	srv := httptest.NewServer(Handler(time.Second, limited))
	defer srv.Close()
	body := strings.Repeat("x", 200<<10)
	head := "POST / HTTP/1.1\r\nContent-Length: " + strconv.Itoa(len(body))
	for i := range 20 {
		status, err := raw(t, srv.Listener.Addr().String(), head, body)
		if err != nil || status != http.StatusRequestEntityTooLarge {
			t.Fatalf("try %d: status %d, %v; want 413 and a clean close", i, status, err)
		}
	}
}

// TestUnsentBodyCloses: a body declared and never sent, to a handler that
// does not read it, is answered and its connection closed within the
// bound on reading on, not held for the body's timeout.
func TestUnsentBodyCloses(t *testing.T) {
	srv := httptest.NewServer(Handler(time.Minute, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
	})))
	defer srv.Close()
	start := time.Now()
	status, err := raw(t, srv.Listener.Addr().String(), "POST / HTTP/1.1\r\nContent-Length: 1000", "")
	if err != nil || status != http.StatusUnauthorized {
		t.Fatalf("status %d, %v; want 401 and a clean close", status, err)
	}
	if d := time.Since(start); d > lingerFor+5*time.Second {
		t.Errorf("closed after %v, want within the linger bound %v (plus slack)", d, lingerFor)
	}
}
