// Package linebuf gathers a stream of whole writes, such as log lines, and
// hands them on in batches: one write to the underlying writer for many
// lines, at most a delay after the first of them. An access log writes a
// line per request; written one by one, each is a system call on the
// request's path.
package linebuf

import (
	"io"
	"sync"
	"time"
)

// Writer batches writes for w. Each Write is kept whole: it reaches w in
// one piece, after everything written before it. Safe for concurrent use.
type Writer struct {
	w     io.Writer
	delay time.Duration
	size  int

	mu     sync.Mutex
	buf    []byte
	timer  *time.Timer // set while buf waits for its flush
	closed bool
}

// New returns a Writer that passes on what it holds delay after the first
// write into an empty buffer, or at once when holding more would pass size
// bytes.
func New(w io.Writer, delay time.Duration, size int) *Writer {
	return &Writer{w: w, delay: delay, size: size}
}

// Write holds p for a later write to the underlying writer. It never
// fails: like a log's own writes, an error of the underlying writer is
// dropped. After Close, p is written through at once.
func (b *Writer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		b.w.Write(p)
		return len(p), nil
	}
	if len(b.buf)+len(p) > b.size {
		b.flushLocked()
		if len(p) > b.size {
			b.w.Write(p)
			return len(p), nil
		}
	}
	b.buf = append(b.buf, p...)
	if b.timer == nil {
		b.timer = time.AfterFunc(b.delay, b.Flush)
	}
	return len(p), nil
}

// Flush writes what the Writer holds now.
func (b *Writer) Flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
}

// flushLocked writes the buffer under the lock, so that batches keep their
// order and a Write waits for the one before it.
func (b *Writer) flushLocked() {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if len(b.buf) == 0 {
		return
	}
	b.w.Write(b.buf)
	b.buf = b.buf[:0]
}

// Through returns a writer to the same stream for writes that must not wait,
// such as a log's other lines: each one first writes what the Writer
// holds, so that the stream keeps the order of the writes.
func (b *Writer) Through() io.Writer { return through{b} }

type through struct{ b *Writer }

func (t through) Write(p []byte) (int, error) {
	t.b.mu.Lock()
	defer t.b.mu.Unlock()
	t.b.flushLocked()
	return t.b.w.Write(p)
}

// Close flushes what is held; later writes go straight through.
func (b *Writer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
	b.closed = true
	return nil
}
