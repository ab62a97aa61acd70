// Package service gives a relay's background work one lifecycle: each
// piece is started once, after what it depends on, and stopped once, before
// it.
package service

import "sync"

// Service is background work. Start begins it on goroutines of its own;
// Stop ends it, finishing what must be finished (acknowledgements are
// written, a pass under way ends), and returns once it has.
type Service interface {
	Start()
	Stop()
}

// Group starts services in the order given and stops them in the reverse
// order. The zero Group is ready to use.
type Group struct {
	mu      sync.Mutex
	started []Service
	stopped bool
}

// Start starts each service in turn. After Stop it starts nothing.
func (g *Group) Start(services ...Service) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return
	}
	for _, s := range services {
		s.Start()
		g.started = append(g.started, s)
	}
}

// Stop stops every started service, the last started first; it is safe to
// call more than once.
func (g *Group) Stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stopped = true
	for i := len(g.started) - 1; i >= 0; i-- {
		g.started[i].Stop()
	}
	g.started = nil
}
