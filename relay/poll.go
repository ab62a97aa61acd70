package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/flamenet/relay/internal/parking"
	"github.com/flamenet/relay/internal/position"
	"github.com/flamenet/relay/internal/wire"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/token"
	"github.com/flamenet/relay/wake"
)

type envelopeJSON struct {
	Seq     int64  `json:"seq" msgpack:"seq"`
	ID      string `json:"id" msgpack:"id"`
	From    string `json:"from" msgpack:"from"`
	SentAt  string `json:"sent_at" msgpack:"sent_at"`
	Payload []byte `json:"payload" msgpack:"payload"`
}

type pollResponse struct {
	Cursor    int64          `json:"cursor" msgpack:"cursor"`
	Epoch     string         `json:"epoch" msgpack:"epoch"`
	More      bool           `json:"more" msgpack:"more"`
	Envelopes []envelopeJSON `json:"envelopes" msgpack:"envelopes"`
}

var errOverloaded = &httpError{Status: http.StatusServiceUnavailable, Code: codeOverloaded, Message: "Too many polls are held; try again."}

// poll is GET /v1/poll: acknowledge up to cursor, answer what is waiting,
// or hold until a send commits for this device, the wait runs out, a newer
// poll for the device arrives, the device is removed, or the relay drains.
//
// A poll asks the store only when something is there to read: the device's
// head and cursor are known in memory (internal/position), acks are written
// in the background (acks), and a poll whose cursor is current parks
// without a store call.
func (s *Server) poll(w http.ResponseWriter, r *http.Request, c *token.Claims) error {
	p, err := s.startPoll(r, c)
	if p != nil {
		defer p.end()
	}
	if err != nil {
		return err
	}
	return s.hold(r.Context(), w, r, c, p)
}

// pollState is a poll's state between its start and its answer.
type pollState struct {
	s      *Server
	q      pollQuery
	waiter wake.Waiter // nil for wait=0
	pos    position.State
	after  int64 // answer envelopes above this
	// resume: how the wait ended of this poll, read again after it parked.
	resume *parking.Resume
	// parked: the poll's wait went on without its handler, which must
	// not end it.
	parked bool
}

// end unregisters the poll's waiter and counts it out, unless it parked.
func (p *pollState) end() {
	if !p.parked {
		p.release()
	}
}

func (p *pollState) release() {
	if p.waiter != nil {
		p.waiter.Close()
		p.s.limits.held.Add(-1)
	}
}

// startPoll parses the poll, registers its waiter and reads the device's
// position. A non-nil poll must be ended, even with an error.
func (s *Server) startPoll(r *http.Request, c *token.Claims) (*pollState, error) {
	q, err := parsePoll(r, s.cfg.MaxWait)
	if err != nil {
		return nil, err
	}
	rs := resumeOf(r.Context())
	if s.readiness.Draining() && rs == nil { // a parked poll was held before the drain
		return nil, errDraining
	}
	return s.open(r.Context(), c, q, rs)
}

// open starts a delivery, a poll's or a stream's: it registers the
// device's waiter (unless q waits for nothing), reads the device's
// position, acknowledges q's cursor and admits the delivery. rs is how the
// wait of a poll read again after it parked ended; nil otherwise. A
// non-nil state must be ended, even with an error.
func (s *Server) open(ctx context.Context, c *token.Claims, q pollQuery, rs *parking.Resume) (*pollState, error) {
	key := c.Key()
	p := &pollState{s: s, q: q, resume: rs}

	// The waiter is registered BEFORE the first read of the device's
	// position, so an envelope that commits between that read and the
	// wait still wakes this poll at once. TestPollNoLostWakeup (and
	// TestStreamNoLostWakeup) guard this ordering. A parked poll whose
	// wait ended for good (superseded, removed, out of time) answers
	// without registering again: it would supersede the poll that
	// superseded it.
	if q.wait > 0 && (rs == nil || rs.Err == nil) {
		n := s.limits.held.Add(1)
		if s.cfg.MaxHeldPolls > 0 && n > int64(s.cfg.MaxHeldPolls) {
			s.limits.held.Add(-1)
			s.metrics.refusals.WithLabelValues(refusedHeldPolls).Inc()
			return nil, errOverloaded
		}
		var err error
		p.waiter, err = s.hub.Subscribe(ctx, key)
		if err != nil {
			s.limits.held.Add(-1)
			return nil, &httpError{Status: http.StatusServiceUnavailable, Code: codeUnavailable, Message: "Polls cannot be held right now; try again.", Cause: err}
		}
	}

	var err error
	if p.pos, err = s.acknowledge(ctx, c, q.cursor, q.epoch); err != nil {
		return p, err
	}
	if rs == nil { // a parked poll read again was admitted when it came
		if err := s.admitPoll(key, p.pos.Cursor); err != nil {
			return p, err
		}
	}
	if s.hooks.afterFirstRead != nil {
		s.hooks.afterFirstRead(key)
	}
	p.after = p.pos.Cursor
	if rs != nil && rs.Err == nil && p.pos.Pending(p.after) {
		s.metrics.received.Inc() // news woke it while parked
	}
	return p, nil
}

// pollQuery is a poll's parameters.
type pollQuery struct {
	cursor int64  // -1: the stored cursor
	epoch  string // the store's epoch the cursor is of; "": not checked
	limit  int
	wait   time.Duration
}

func parsePoll(r *http.Request, maxWait time.Duration) (pollQuery, error) {
	q, err := parseQuery(r)
	if err != nil {
		return pollQuery{}, err
	}
	cursor, err := q.int("cursor", -1, 0, math.MaxInt64)
	if err != nil {
		return pollQuery{}, err
	}
	waitSecs, err := q.int("wait", 0, 0, int64(maxWait/time.Second))
	if err != nil {
		return pollQuery{}, err
	}
	limit, err := q.int("limit", 1000, 1, 1000)
	if err != nil {
		return pollQuery{}, err
	}
	epoch, err := q.epoch()
	if err != nil {
		return pollQuery{}, err
	}
	return pollQuery{cursor: cursor, epoch: epoch, limit: int(limit), wait: time.Duration(waitSecs) * time.Second}, nil
}

// hold answers what is waiting above the position, or holds the poll until
// something is: parked (park.go) when it can be, which gives the request's
// goroutine and buffers up, or else in this frame (with the few above it).
// All a poll does before it holds is in startPoll, and all it does only
// when it answers (fetching, encoding, refusing) in functions of their
// own, so that a stack held here stays small enough for the runtime to
// shrink (BenchmarkHeldPollMemory).
func (s *Server) hold(ctx context.Context, w http.ResponseWriter, r *http.Request, c *token.Claims, p *pollState) error {
	deadline := s.pollDeadline(p.q.wait)
	if p.resume != nil {
		deadline = p.resume.Deadline
	}
	for {
		if p.pos.Pending(p.after) {
			after := p.after
			write := func(b store.Batch) error { writePoll(w, r, after, b); return nil }
			if done, err := s.deliver(ctx, r, c, p, write); done || err != nil {
				return err
			}
		}
		if rs := p.resume; rs != nil && rs.Err != nil {
			p.resume = nil
			return s.endHold(ctx, w, r, rs.Err, p.after, p.pos.Epoch)
		}
		if p.waiter == nil {
			return s.answerEmpty(w, r, p.after, p.pos.Epoch, pollEmpty)
		}
		if s.park(w, r, p, deadline) {
			return errParked
		}
		if werr := s.wait(ctx, p.waiter, deadline); werr != nil {
			return s.endHold(ctx, w, r, werr, p.after, p.pos.Epoch)
		}
		startStoreBudget(ctx, s.cfg.StoreTimeout)
		if err := s.woken(ctx, r, c, p); err != nil {
			return err
		}
	}
}

// deliver fetches what is waiting above p's after and hands it to write,
// a poll's answer or a stream's event, and moves after past it; done is
// false when nothing was there after all. The batch's bytes are held
// against the bounds on answers in flight from before the fetch until
// write returns; past a bound the delivery is refused.
func (s *Server) deliver(ctx context.Context, r *http.Request, c *token.Claims, p *pollState, write func(store.Batch) error) (done bool, err error) {
	pos, after, limit := p.pos, p.after, p.q.limit
	key := c.Key()
	if pos.Head == after+1 {
		// One envelope waits: if it was committed here a moment ago, it
		// is in memory, checked against the removal its send saw.
		if e, ok := s.memory.Recent(key, pos.Head, pos.Life); ok {
			if !pos.Life.Admits(c.IssuedAt) {
				notePoll(r.Context(), pollRemoved)
				return true, s.refuseToken(r, refusedRemoved, nil)
			}
			b := store.Batch{Envelopes: []store.Envelope{e}, Epoch: pos.Epoch}
			hold, err := s.holdAnswer(key, batchAnswerSize(b))
			if err != nil {
				return true, err
			}
			defer hold.release()
			notePoll(r.Context(), pollDelivered)
			p.after = e.Seq
			return true, write(b)
		}
	}
	hold, err := s.holdAnswer(key, s.cfg.pendingAnswerSize(pos.Head-after, limit))
	if err != nil {
		return true, err
	}
	defer hold.release()
	batch, err := s.fetch(ctx, c, after, limit)
	if err != nil {
		return true, err
	}
	hold.resize(batchAnswerSize(batch))
	if p.q.epoch != "" && batch.Epoch != p.q.epoch {
		// The store's history changed since the position was read: its
		// envelopes above the cursor are not the ones the cursor counts.
		return true, s.epochChanged(ctx, c)
	}
	if len(batch.Envelopes) == 0 {
		// Nothing stored up to the head (expired unread): later polls
		// need not look again until the head moves.
		s.memory.Empty(key, pos.Life, pos.Head)
		return false, nil
	}
	// Read in the same snapshot as the envelopes: a removal this relay has
	// not heard of yet must not hand a device registered again since to an
	// older token.
	if !batch.Life.Admits(c.IssuedAt) {
		notePoll(r.Context(), pollRemoved)
		return true, s.refuseToken(r, refusedRemoved, nil)
	}
	notePoll(r.Context(), pollDelivered)
	p.after = batch.Envelopes[len(batch.Envelopes)-1].Seq
	return true, write(batch)
}

// woken reads the position again after a wake-up: the hub told the
// position cache first, so memory has the news (or, after news was lost,
// a miss that reads the store).
func (s *Server) woken(ctx context.Context, r *http.Request, c *token.Claims, p *pollState) error {
	pos, err := s.position(ctx, c)
	if err != nil {
		return err
	}
	p.pos = pos
	p.after = max(p.after, pos.Cursor)
	if !pos.Life.Admits(c.IssuedAt) {
		notePoll(r.Context(), pollRemoved)
		return s.refuseToken(r, refusedRemoved, nil)
	}
	if p.q.epoch != "" {
		// Woken by a new epoch of the store, maybe: the poll's cursor
		// then counts seqs of another history.
		if p.pos, err = s.checkEpoch(ctx, c, pos, p.q.epoch); err != nil {
			return err
		}
	}
	if p.pos.Pending(p.after) {
		s.metrics.received.Inc() // news, not a fallback round's re-read
	}
	return nil
}

// endHold answers a held poll whose wait ended without news.
func (s *Server) endHold(ctx context.Context, w http.ResponseWriter, r *http.Request, werr error, after int64, epoch string) error {
	switch {
	case ctx.Err() != nil:
		notePoll(r.Context(), pollHangup)
		return nil // the client hung up; nobody to answer
	case errors.Is(werr, wake.ErrRemoved):
		// The device was removed while its poll was held: the token that
		// holds it is no longer good.
		notePoll(r.Context(), pollRemoved)
		return s.refuseToken(r, refusedRemoved, nil)
	case errors.Is(werr, wake.ErrSuperseded):
		return s.answerEmpty(w, r, after, epoch, pollSuperseded)
	case errors.Is(werr, wake.ErrClosed):
		return s.answerEmpty(w, r, after, epoch, pollDrained)
	}
	// Out of time: answer with what we have, which is nothing.
	return s.answerEmpty(w, r, after, epoch, pollEmpty)
}

func (s *Server) answerEmpty(w http.ResponseWriter, r *http.Request, after int64, epoch, outcome string) error {
	notePoll(r.Context(), outcome)
	writePoll(w, r, after, store.Batch{Epoch: epoch})
	return nil
}

// pollDeadline is when a held poll with nothing to read answers empty: at
// a small random point before its wait runs out (up to a tenth of it, at
// most holdJitter), so that polls which started together (after a restart,
// a deploy) do not stay together, each round spreading them further.
func (s *Server) pollDeadline(wait time.Duration) time.Time {
	early := min(wait/10, holdJitter)
	if early > 0 {
		wait -= time.Duration(rand.Int64N(int64(early)))
	}
	return time.Now().Add(wait)
}

// holdJitter is the most a held poll answers before its wait runs out.
const holdJitter = 3 * time.Second

// acknowledge is the start of a poll or an ack: it reads the device's
// position (memory, or the store on first use), refuses a cursor of
// another epoch than the store's (when the client names one) or above the
// head, and records the acknowledgement for the background writer. The
// position it returns has the cursor the client sent, if that is higher.
// cursor < 0 acknowledges nothing.
func (s *Server) acknowledge(ctx context.Context, c *token.Claims, cursor int64, epoch string) (position.State, error) {
	pos, err := s.position(ctx, c)
	if err != nil {
		return pos, err
	}
	if epoch != "" {
		// TestEpochRestoreResync goes red without this check.
		if pos, err = s.checkEpoch(ctx, c, pos, epoch); err != nil {
			return pos, err
		}
	}
	key := c.Key()
	now := s.now()
	if cursor > pos.Head && !pos.AheadOf(cursor, now) {
		// Memory may not have heard of the latest send yet: the store
		// decides (and memory keeps its word for a while, so that a
		// client repeating the cursor costs no read each time).
		if pos, err = s.readPosition(ctx, c); err != nil {
			return pos, err
		}
		if epoch != "" && pos.Epoch != epoch {
			s.watch.Nudge()
			return pos, epochAhead(pos)
		}
		if cursor > pos.Head {
			s.memory.HeadRead(key, pos.Life, pos.Head, now)
		}
	}
	// Whatever memory knew when the token was checked, the life read here
	// decides: a token of an earlier life acknowledges nothing.
	if !pos.Life.Admits(c.IssuedAt) {
		return pos, fmt.Errorf("relay: acknowledge: %w", store.ErrRemoved)
	}
	if cursor > pos.Head {
		head := pos.Head
		return pos, &httpError{Status: http.StatusConflict, Code: codeCursorAhead, Message: "The cursor is above the highest seq this device was given.", Head: &head, Epoch: pos.Epoch}
	}
	return s.memory.Acknowledge(key, pos, cursor, now), nil
}

// checkEpoch refuses a request whose cursor is of another epoch than the
// store's current one: the relay's (its watch's last good check), and the
// one the position was read in. When the two differ, the store decides,
// read again, and the watch is nudged to check soon.
func (s *Server) checkEpoch(ctx context.Context, c *token.Claims, pos position.State, epoch string) (position.State, error) {
	cur := s.watch.Epoch()
	if pos.Epoch == epoch && (cur == "" || cur == epoch) {
		return pos, nil
	}
	if cur != "" && pos.Epoch != cur {
		// Memory may hold a read of the epoch before; or the store has
		// moved on since the watch's check.
		var err error
		if pos, err = s.readPosition(ctx, c); err != nil {
			return pos, err
		}
		if pos.Epoch == epoch && pos.Epoch != cur {
			// The store is at the client's epoch and the watch has
			// not seen it yet: the client resynchronised already. Let
			// the watch drop memory of the old epoch, then go on.
			s.watch.Sync(ctx)
			cur = s.watch.Epoch()
		} else if pos.Epoch != cur {
			s.watch.Nudge()
		}
		if pos.Epoch == epoch && pos.Epoch == cur {
			return pos, nil
		}
	}
	return pos, epochAhead(pos)
}

// epochChanged answers a poll whose store read named another epoch than
// the poll's: the store's position, read again, in its 409.
func (s *Server) epochChanged(ctx context.Context, c *token.Claims) error {
	s.watch.Nudge()
	pos, err := s.readPosition(ctx, c)
	if err != nil {
		return err
	}
	return epochAhead(pos)
}

// epochAhead is the 409 for a cursor of another epoch than pos's: the
// client polls once without cursor and epoch, and takes that answer's.
func epochAhead(pos position.State) error {
	head := pos.Head
	return &httpError{Status: http.StatusConflict, Code: codeCursorAhead,
		Message: "The cursor is of another epoch of the store (its history went back): poll without cursor and epoch to resynchronise.",
		Head:    &head, Epoch: pos.Epoch}
}

// position is what is known of the token's device: from memory, or read
// from the store (and registered, for a device's first poll or ack).
func (s *Server) position(ctx context.Context, c *token.Claims) (position.State, error) {
	if pos, ok := s.memory.Known(c.Key()); ok && pos.Exists && pos.Epoch != "" {
		return pos, nil
	}
	return s.readPosition(ctx, c)
}

// readPosition reads the device's position from the store, registering a
// device that polls or acks before it ever registered (unless the token is
// older than the device's last removal: store.ErrRemoved), and merges it
// into memory.
func (s *Server) readPosition(ctx context.Context, c *token.Claims) (position.State, error) {
	if sendersCall(ctx) {
		return position.State{}, errNeedsStore
	}
	return offload(func() (position.State, error) {
		ctx, cancel := s.storeCtx(ctx)
		defer cancel()
		// The store judges the token in the statement that would register
		// the device, against removals this relay may not have heard of.
		return s.memory.Read(ctx, c.Key(), issuedAt(c))
	})
}

func (s *Server) fetch(ctx context.Context, c *token.Claims, after int64, limit int) (store.Batch, error) {
	if sendersCall(ctx) {
		return store.Batch{}, errNeedsStore
	}
	return offload(func() (store.Batch, error) {
		ctx, cancel := s.storeCtx(ctx)
		defer cancel()
		return s.store.Fetch(ctx, store.FetchParams{
			Household: c.Household, Device: c.Device, After: after, Limit: limit, Budget: s.cfg.PollBudgetBytes,
		})
	})
}

// wait blocks on the waiter until deadline. It returns nil on a wake-up.
func (s *Server) wait(ctx context.Context, waiter wake.Waiter, deadline time.Time) error {
	if !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err := waiter.Wait(wctx)
	if err == nil || errors.Is(err, wake.ErrSuperseded) || errors.Is(err, wake.ErrClosed) {
		return err
	}
	if wctx.Err() != nil {
		return wctx.Err()
	}
	return err
}

// writePollFlush is how many encoded bytes a poll's answer gathers before
// it writes them.
const writePollFlush = 32 << 10

// pollBuffers are writePoll's buffers.
var pollBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// writePoll answers a poll with b's envelopes, or with the cursor stored
// when there are none, and b's epoch.
func writePoll(w http.ResponseWriter, r *http.Request, stored int64, b store.Batch) {
	mp := wire.WantsMsgpack(r)
	h := w.Header()
	if mp {
		h.Set("Content-Type", wire.ContentMsgpack)
	} else {
		h.Set("Content-Type", wire.ContentJSON)
	}
	h.Set("Cache-Control", "no-store")
	setAnswerDeadline(w, r, batchAnswerSize(b))
	w.WriteHeader(http.StatusOK)
	_ = encodeAnswer(w, mp, stored, b, "", "\n")
}

// encodeAnswer writes the answer carrying b (its cursor stored when b has
// no envelopes) to out, in JSON between prefix and suffix, or in
// MessagePack (without them). It is written as it is encoded, a few
// envelopes at a time, and each payload is let go once written, so that an
// answer blocked on its client holds no more than its batch and one
// envelope's encoding (an answer encoded whole held that twice over, and
// more while its buffer grew). The bytes are those json.Marshal or
// msgpack.Marshal would give for a pollResponse (TestWritePollEncoding).
// The error is the first write's that failed: the rest is not encoded.
func encodeAnswer(out io.Writer, mp bool, stored int64, b store.Batch, prefix, suffix string) error {
	cursor := stored
	if n := len(b.Envelopes); n > 0 {
		cursor = b.Envelopes[n-1].Seq
	}
	buf := pollBuffers.Get().(*bytes.Buffer)
	defer func() {
		// One large envelope grows a buffer past what most answers need:
		// such a buffer is left to the collector.
		if buf.Cap() <= 2*writePollFlush {
			buf.Reset()
			pollBuffers.Put(buf)
		}
	}()
	// Past writePollFlush, what is gathered goes out.
	var werr error
	flush := func(final bool) bool {
		if buf.Len() < writePollFlush && !final {
			return true
		}
		_, werr = out.Write(buf.Bytes())
		buf.Reset()
		return werr == nil
	}
	// Encoding these types cannot fail: they are numbers, strings and bytes.
	if mp {
		enc := msgpack.GetEncoder()
		defer msgpack.PutEncoder(enc)
		enc.Reset(buf)
		_ = enc.EncodeMapLen(4)
		_ = enc.EncodeString("cursor")
		_ = enc.Encode(cursor)
		_ = enc.EncodeString("epoch")
		_ = enc.EncodeString(b.Epoch)
		_ = enc.EncodeString("more")
		_ = enc.EncodeBool(b.More)
		_ = enc.EncodeString("envelopes")
		_ = enc.EncodeArrayLen(len(b.Envelopes))
		for i := range b.Envelopes {
			_ = enc.Encode(wireEnvelope(&b.Envelopes[i]))
			if !flush(false) {
				return werr
			}
		}
		flush(true)
		return werr
	}
	buf.WriteString(prefix)
	buf.WriteString(`{"cursor":`)
	buf.Write(strconv.AppendInt(buf.AvailableBuffer(), cursor, 10))
	buf.WriteString(`,"epoch":`)
	buf.Write(strconv.AppendQuote(buf.AvailableBuffer(), b.Epoch)) // base64url: nothing to escape
	buf.WriteString(`,"more":`)
	buf.WriteString(strconv.FormatBool(b.More))
	buf.WriteString(`,"envelopes":[`)
	enc := json.NewEncoder(buf)
	for i := range b.Envelopes {
		if i > 0 {
			buf.WriteByte(',')
		}
		_ = enc.Encode(wireEnvelope(&b.Envelopes[i]))
		buf.Truncate(buf.Len() - 1) // Encode ends each value with a newline
		if !flush(false) {
			return werr
		}
	}
	buf.WriteString("]}")
	buf.WriteString(suffix)
	flush(true)
	return werr
}

// wireEnvelope is e as an answer carries it. It takes e's payload: the
// batch lets each go once it is encoded.
func wireEnvelope(e *store.Envelope) *envelopeJSON {
	out := &envelopeJSON{Seq: e.Seq, ID: e.ID, From: e.From, SentAt: wire.Timestamp(e.SentAt), Payload: e.Payload}
	e.Payload = nil
	return out
}
