package linebuf

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/servicetest"
)

// sink records each write it is given, and signals every one.
type sink struct {
	mu     sync.Mutex
	writes []string
	wrote  chan struct{}
}

func newSink() *sink { return &sink{wrote: make(chan struct{}, 1000)} }

func (s *sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.writes = append(s.writes, string(p))
	s.mu.Unlock()
	s.wrote <- struct{}{}
	return len(p), nil
}

func (s *sink) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.writes...)
}

func TestLinesArriveTogetherAfterTheDelay(t *testing.T) {
	s := newSink()
	b := New(s, 20*time.Millisecond, 1<<10)
	start := time.Now()
	for i := range 3 {
		fmt.Fprintf(b, "line %d\n", i)
	}
	if got := s.all(); len(got) != 0 {
		t.Fatalf("written at once: %q", got)
	}
	select {
	case <-s.wrote:
	case <-time.After(5 * time.Second):
		t.Fatal("nothing written 5s after the writes")
	}
	if waited := time.Since(start); waited < 20*time.Millisecond {
		t.Errorf("written after %v, before the delay", waited)
	}
	if got := s.all(); len(got) != 1 || got[0] != "line 0\nline 1\nline 2\n" {
		t.Errorf("writes %q, want the three lines in one", got)
	}
}

func TestFullBufferIsWrittenAtOnce(t *testing.T) {
	s := newSink()
	b := New(s, time.Hour, 10)
	b.Write([]byte("12345\n"))
	b.Write([]byte("67890\n")) // would pass 10 bytes: the first goes now
	if got := s.all(); len(got) != 1 || got[0] != "12345\n" {
		t.Fatalf("writes %q, want the first line alone", got)
	}
	b.Write([]byte("a line longer than the buffer\n"))
	if got := s.all(); len(got) != 3 || got[1] != "67890\n" || got[2] != "a line longer than the buffer\n" {
		t.Fatalf("writes %q, want the held line, then the long one whole", got)
	}
	b.Close()
}

func TestCloseWritesWhatIsHeld(t *testing.T) {
	s := newSink()
	b := New(s, time.Hour, 1<<10)
	b.Write([]byte("last words\n"))
	b.Close()
	if got := s.all(); len(got) != 1 || got[0] != "last words\n" {
		t.Fatalf("after Close: %q", got)
	}
	b.Write([]byte("after\n"))
	if got := s.all(); len(got) != 2 || got[1] != "after\n" {
		t.Fatalf("a write after Close: %q, want it written through", got)
	}
}

func TestThroughKeepsTheOrder(t *testing.T) {
	s := newSink()
	b := New(s, time.Hour, 1<<10)
	b.Write([]byte("held\n"))
	b.Through().Write([]byte("urgent\n"))
	if got := s.all(); len(got) != 2 || got[0] != "held\n" || got[1] != "urgent\n" {
		t.Fatalf("writes %q, want the held line, then the urgent one, at once", got)
	}
	b.Close()
}

// TestConcurrentWritesStayWhole runs writers at once, with the race
// detector in CI: every line arrives once, whole, and each writer's lines
// in its order.
func TestConcurrentWritesStayWhole(t *testing.T) {
	var out servicetest.Buffer
	b := New(&out, time.Millisecond, 256)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 200 {
				fmt.Fprintf(b, "writer %d line %03d %s\n", w, i, strings.Repeat("x", w*3))
			}
		})
	}
	wg.Wait()
	b.Close()
	next := map[int]int{}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 8*200 {
		t.Fatalf("%d lines, want %d", len(lines), 8*200)
	}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 4 {
			t.Fatalf("torn line %q", l)
		}
		var w, i int
		w, _ = strconv.Atoi(f[1])
		i, _ = strconv.Atoi(f[3])
		if want := fmt.Sprintf("writer %d line %03d %s", w, i, strings.Repeat("x", w*3)); l != want {
			t.Fatalf("line %q, want %q", l, want)
		}
		if i != next[w] {
			t.Fatalf("writer %d: line %d after %d", w, i, next[w]-1)
		}
		next[w]++
	}
}
