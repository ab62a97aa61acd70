package relay

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/flamenet/relay/internal/wire"
)

// TestWritePollEncoding: a poll's answer, written as it is encoded, has
// the bytes json.Marshal and msgpack.Marshal give for the whole answer: an
// empty one, one whose ids JSON escapes, and one of more envelopes than
// MessagePack's smallest array holds.
func TestWritePollEncoding(t *testing.T) {
	h := newHarness(t, nil)
	tok := h.register("home", "phone")
	sender := h.register("home", "laptop")
	check := func(what string, cursor int64) {
		t.Helper()
		r := h.must("GET", fmt.Sprintf("/v1/poll?cursor=%d&wait=0", cursor), tok, nil, http.StatusOK)
		var p pollResponse
		r.json(t, &p)
		want, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if string(r.body) != string(want)+"\n" {
			t.Fatalf("%s, JSON:\n got %s\nwant %s", what, r.body, want)
		}
		r = h.must("GET", fmt.Sprintf("/v1/poll?cursor=%d&wait=0", cursor), tok, nil, http.StatusOK, "Accept", wire.ContentMsgpack)
		var q pollResponse
		if err := msgpack.Unmarshal(r.body, &q); err != nil {
			t.Fatal(err)
		}
		if want, err = msgpack.Marshal(q); err != nil {
			t.Fatal(err)
		}
		if string(r.body) != string(want) {
			t.Fatalf("%s, MessagePack:\n got %x\nwant %x", what, r.body, want)
		}
		if len(q.Envelopes) != len(p.Envelopes) || q.Cursor != p.Cursor || q.Epoch != p.Epoch || len(p.Epoch) != 16 {
			t.Fatalf("%s: the codecs disagree: %+v and %+v", what, p, q)
		}
	}
	check("no envelopes", 0)
	h.send(sender, `<a href="x">&amp;</a>\`, []byte("escaped"), "phone")
	check("an id JSON escapes", 0)
	for i := range 40 {
		h.send(sender, fmt.Sprint("many-", i), make([]byte, 1000+i), "phone")
	}
	check("41 envelopes", 0)
	check("the last 40", 1)

}
