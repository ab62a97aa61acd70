package hapg

import (
	"errors"
	"io"
	"net"
	"sync"
)

// link forwards TCP from a loopback address to a target, and can be cut
// (every connection closed, new ones refused) and restored: one side of a
// network split.
type link struct {
	addr, target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newLink(addr, target string) (*link, error) {
	l := &link{addr: addr, target: target, conns: map[net.Conn]bool{}}
	return l, l.listen()
}

func (l *link) listen() error {
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.ln = ln
	l.mu.Unlock()
	l.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", l.target)
			if err != nil {
				c.Close()
				continue
			}
			l.mu.Lock()
			if l.ln != ln { // cut meanwhile
				l.mu.Unlock()
				c.Close()
				up.Close()
				continue
			}
			l.conns[c], l.conns[up] = true, true
			l.mu.Unlock()
			l.wg.Go(func() { l.pipe(up, c) })
			l.wg.Go(func() { l.pipe(c, up) })
		}
	})
	return nil
}

func (l *link) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	l.mu.Lock()
	delete(l.conns, dst)
	delete(l.conns, src)
	l.mu.Unlock()
}

// cut closes every connection and refuses new ones until restore.
func (l *link) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln != nil {
		l.ln.Close()
		l.ln = nil
	}
	for c := range l.conns {
		c.Close()
	}
	clear(l.conns)
}

// restore listens again on the same address.
func (l *link) restore() error {
	l.mu.Lock()
	up := l.ln != nil
	l.mu.Unlock()
	if up {
		return nil
	}
	return l.listen()
}

// close cuts the link for good and waits for its goroutines.
func (l *link) close() {
	l.cut()
	l.wg.Wait()
}

var errNoLinks = errors.New("hapg: the formation was not started with Partitionable")
