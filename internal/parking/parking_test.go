package parking

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestBackReplaysAndResumes: a connection handed back is accepted with the
// request's bytes in front of what the client sends next, and its first
// request, only, finds how the wait ended; the lot's Close waits until
// then. With Take not counting the poll back, Close timed out (tried).
func TestBackReplaysAndResumes(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	lot := New(&net.TCPAddr{}, 0)
	if !lot.Enter() {
		t.Fatal("Enter refused on a new lot")
	}
	rs := &Resume{Err: context.DeadlineExceeded}
	go func() {
		if !lot.Back(server, []byte("GET /v1/poll HTTP/1.1\r\n\r\n"), rs) {
			t.Error("Back refused on an open lot")
		}
	}()
	conn, err := lot.Listener().Accept()
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = client.Write([]byte("next")) }()
	got := make([]byte, len("GET /v1/poll HTTP/1.1\r\n\r\nnext"))
	if _, err := io.ReadFull(conn, got); err != nil || string(got) != "GET /v1/poll HTTP/1.1\r\n\r\nnext" {
		t.Fatalf("read %q, %v", got, err)
	}

	closed := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() { closed <- lot.Close(ctx) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) before the poll came back", err)
	default:
	}
	reqCtx := ConnContext(context.Background(), conn)
	if got := Take(reqCtx); got != rs || !errors.Is(got.Err, context.DeadlineExceeded) {
		t.Fatalf("Take = %+v, want the wait's resume", got)
	}
	if Take(reqCtx) != nil {
		t.Fatal("a second request on the connection found the resume too")
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close after the poll came back: %v", err)
	}
	if lot.Enter() {
		t.Fatal("Enter after Close")
	}
}

// TestBackAfterListenerClosed: once the listener is closed nothing is
// handed back, and a connection dropped unread counts as come back when
// closed.
func TestBackAfterListenerClosed(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	lot := New(&net.TCPAddr{}, 0)
	lot.Enter()
	lot.CloseListener()
	rs := &Resume{}
	if lot.Back(server, nil, rs) {
		t.Fatal("Back on a closed listener")
	}
	rs.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lot.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}
