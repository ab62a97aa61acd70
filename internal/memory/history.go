package memory

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flamenet/relay/store"
)

// HistoryCheckConfig is what a HistoryCheck needs.
type HistoryCheckConfig struct {
	Store  store.Probe
	Memory *Memory
	// Interval is how often the store's history is checked; 0: a second.
	Interval time.Duration
	// Timeout bounds one check.
	Timeout time.Duration
	Logger  *slog.Logger
	// Dropped runs after memory was dropped, on the check's goroutine,
	// with whether the epoch changed (the new one is Epoch's by then):
	// the relay counts it and, for a new epoch, wakes every held poll so
	// that each checks its epoch again.
	Dropped func(epochChanged bool)
}

// HistoryCheck keeps a relay's memory true to the store it is talking to. It
// checks the store's history (store.History) every interval, and soon
// after Nudge: when a check fails, or the store's instance or epoch is
// not the last good check's, what memory knows may be of another store
// (a failover, a restore, a file put in place), and is dropped
// (Memory.Lost; for a new epoch Memory.EpochChanged, which also drops the
// acknowledgements taken in the old one).
type HistoryCheck struct {
	cfg   HistoryCheckConfig
	log   *slog.Logger
	epoch atomic.Pointer[string] // the last good check's; nil before one
	last  store.History          // the last good check; the loop's own
	good  bool                   // a check succeeded once
	down  bool                   // the last check failed
	nudge chan struct{}
	stop  chan struct{}
	done  chan struct{}

	mu   sync.Mutex
	next chan struct{} // closed when the next check to begin has ended
}

// nudgeGap is the least time between two checks that a nudge brings: a
// store that fails every request is not asked for its history as often.
const nudgeGap = 100 * time.Millisecond

// NewHistoryCheck returns a check, not started.
func NewHistoryCheck(cfg HistoryCheckConfig) *HistoryCheck {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Dropped == nil {
		cfg.Dropped = func(bool) {}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &HistoryCheck{cfg: cfg, log: log, nudge: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		next: make(chan struct{})}
}

// Start checks once, so that the relay knows the epoch before it serves,
// and then goes on in the background.
func (w *HistoryCheck) Start() {
	w.checkOnce()
	go w.run()
}

// Stop ends the checks.
func (w *HistoryCheck) Stop() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// Nudge asks for a check soon: a store call failed as unavailable, or a
// read named another epoch than the current one.
func (w *HistoryCheck) Nudge() {
	select {
	case w.nudge <- struct{}{}:
	default:
	}
}

// Sync asks for a check and waits until one that began after the call
// has ended, or ctx ends: a request that found the store at an epoch the
// check has not seen yet waits for memory of the old one to be dropped,
// instead of sending its client to resynchronise a second time.
func (w *HistoryCheck) Sync(ctx context.Context) {
	w.mu.Lock()
	ch := w.next
	w.mu.Unlock()
	w.Nudge()
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// Epoch is the store's current epoch as of the last good check; "" before
// any.
func (w *HistoryCheck) Epoch() string {
	if e := w.epoch.Load(); e != nil {
		return *e
	}
	return ""
}

func (w *HistoryCheck) run() {
	defer close(w.done)
	defer func() {
		// Stopped: nobody waits for a check that will not come.
		w.mu.Lock()
		close(w.next)
		w.mu.Unlock()
	}()
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		case <-w.nudge:
		}
		w.checkOnce()
		gap := time.NewTimer(nudgeGap)
		select {
		case <-w.stop:
			gap.Stop()
			return
		case <-gap.C:
		}
	}
}

// checkOnce is check, and the end of the Sync calls that came before it.
func (w *HistoryCheck) checkOnce() {
	w.mu.Lock()
	done := w.next
	w.next = make(chan struct{})
	w.mu.Unlock()
	w.check()
	close(done)
}

// check reads the store's history and drops memory when it is not the
// last good check's, or cannot be read.
func (w *HistoryCheck) check() {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.Timeout)
	h, err := w.cfg.Store.History(ctx)
	cancel()
	if err != nil {
		if !w.down {
			w.log.Warn("the store's history cannot be read: what the relay remembers of devices is read again from the store", "err", err)
		}
		w.down = true
		w.cfg.Memory.Lost()
		w.cfg.Dropped(false)
		return
	}
	if w.down {
		w.log.Info("the store's history is read again", "epoch", h.Epoch)
	}
	w.down = false
	was, good := w.last, w.good
	w.last, w.good = h, true
	switch {
	case !good:
		w.epoch.Store(&h.Epoch)
	case h.Epoch != was.Epoch:
		// The new epoch is current before anyone is woken.
		w.epoch.Store(&h.Epoch)
		dropped := w.cfg.Memory.EpochChanged(h.Epoch)
		w.log.Warn("the store's epoch changed: its history may have gone back (a restore, a failover that lost commits); clients resynchronise",
			"old_epoch", was.Epoch, "epoch", h.Epoch, "acks_dropped", dropped)
		w.cfg.Dropped(true)
	case h.Instance != was.Instance:
		w.log.Info("the store's instance changed (a failover, a restart); its epoch did not", "epoch", h.Epoch)
		w.cfg.Memory.Lost()
		w.cfg.Dropped(false)
	}
}
