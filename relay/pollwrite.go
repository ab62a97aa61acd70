package relay

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/flamenet/relay/store"
)

// writePollFlush is how many encoded bytes a poll's answer gathers before
// it writes them.
const writePollFlush = 32 << 10

// pollBuffers are writePoll's buffers.
var pollBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// writePoll answers a poll with b's envelopes, or with the cursor stored
// when there are none. The answer is written as it is encoded, a few
// envelopes at a time, and each payload is let go once written, so that
// an answer blocked on its client holds no more than its batch and one
// envelope's encoding (an answer encoded whole held that twice over, and
// more while its buffer grew). The bytes are those json.Marshal or
// msgpack.Marshal would give for a pollResponse (TestWritePollEncoding).
func writePoll(w http.ResponseWriter, r *http.Request, stored int64, b store.Batch) {
	cursor := stored
	if n := len(b.Envelopes); n > 0 {
		cursor = b.Envelopes[n-1].Seq
	}
	mp := wantsMsgpack(r)
	h := w.Header()
	if mp {
		h.Set("Content-Type", contentMsgpack)
	} else {
		h.Set("Content-Type", contentJSON)
	}
	h.Set("Cache-Control", "no-store")
	setAnswerDeadline(w, r, batchAnswerSize(b))
	w.WriteHeader(http.StatusOK)

	buf := pollBuffers.Get().(*bytes.Buffer)
	defer func() {
		// One large envelope grows a buffer past what most answers need:
		// such a buffer is left to the collector.
		if buf.Cap() <= 2*writePollFlush {
			buf.Reset()
			pollBuffers.Put(buf)
		}
	}()
	// Past writePollFlush, what is gathered goes out; false once a write
	// failed (a client gone, or cut): the rest is not worth encoding.
	flush := func(final bool) bool {
		if buf.Len() < writePollFlush && !final {
			return true
		}
		_, err := w.Write(buf.Bytes())
		buf.Reset()
		return err == nil
	}
	// Encoding these types cannot fail: they are numbers, strings and bytes.
	if mp {
		enc := msgpack.GetEncoder()
		defer msgpack.PutEncoder(enc)
		enc.Reset(buf)
		_ = enc.EncodeMapLen(3)
		_ = enc.EncodeString("cursor")
		_ = enc.Encode(cursor)
		_ = enc.EncodeString("more")
		_ = enc.EncodeBool(b.More)
		_ = enc.EncodeString("envelopes")
		_ = enc.EncodeArrayLen(len(b.Envelopes))
		for i := range b.Envelopes {
			_ = enc.Encode(wireEnvelope(&b.Envelopes[i]))
			if !flush(false) {
				return
			}
		}
		flush(true)
		return
	}
	buf.WriteString(`{"cursor":`)
	buf.Write(strconv.AppendInt(buf.AvailableBuffer(), cursor, 10))
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
			return
		}
	}
	buf.WriteString("]}\n")
	flush(true)
}

// wireEnvelope is e as an answer carries it. It takes e's payload: the
// batch lets each go once it is encoded.
func wireEnvelope(e *store.Envelope) *envelopeJSON {
	out := &envelopeJSON{Seq: e.Seq, ID: e.ID, From: e.From, SentAt: timestamp(e.SentAt), Payload: e.Payload}
	e.Payload = nil
	return out
}
