package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"

	"github.com/vmihailenco/msgpack/v5"
)

const (
	contentJSON    = "application/json"
	contentMsgpack = "application/msgpack"
)

func isMsgpack(mediaType string) bool {
	mt, _, err := mime.ParseMediaType(mediaType)
	return err == nil && (mt == contentMsgpack || mt == "application/x-msgpack")
}

// wantsMsgpack: a response is MessagePack only when the client asks for it.
func wantsMsgpack(r *http.Request) bool {
	for _, a := range r.Header.Values("Accept") {
		for _, part := range bytes.Split([]byte(a), []byte(",")) {
			if isMsgpack(string(bytes.TrimSpace(part))) {
				return true
			}
		}
	}
	return false
}

// readBody reads at most limit bytes of the body; more is a 413.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return nil, errorf(http.StatusRequestEntityTooLarge, codePayloadTooLarge, "The request body is larger than %d bytes.", limit)
	case err != nil:
		return nil, badRequest("The request body could not be read.")
	}
	return b, nil
}

// decodeRequest decodes a JSON or MessagePack body into v. An empty body
// leaves v as it is. Unknown fields are ignored.
func decodeRequest(r *http.Request, body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if isMsgpack(r.Header.Get("Content-Type")) {
		d := msgpack.NewDecoder(bytes.NewReader(body))
		if err := d.Decode(v); err != nil {
			return badRequest("The MessagePack body is not valid: %s", cleanDecodeError(err))
		}
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(body))
	if err := d.Decode(v); err != nil {
		return badRequest("The JSON body is not valid: %s", cleanDecodeError(err))
	}
	if _, err := d.Token(); err != io.EOF {
		return badRequest("The JSON body has data after its end.")
	}
	return nil
}

// cleanDecodeError keeps decoder messages short and free of Go type names.
func cleanDecodeError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return "field " + quote(te.Field) + " has the wrong type"
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return "syntax error"
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return "unexpected end of body"
	}
	return "wrong shape or types"
}

func quote(s string) string { return `"` + s + `"` }

// writeBody encodes v as the client asked (JSON unless it accepts MessagePack).
func writeBody(w http.ResponseWriter, r *http.Request, status int, v any) {
	var (
		b   []byte
		err error
		ct  = contentJSON
	)
	if wantsMsgpack(r) {
		ct = contentMsgpack
		b, err = msgpack.Marshal(v)
	} else {
		b, err = json.Marshal(v)
		b = append(b, '\n')
	}
	if err != nil {
		status, ct = http.StatusInternalServerError, contentJSON
		b = []byte(`{"error":"internal","message":"Internal error."}` + "\n")
	}
	h := w.Header()
	h.Set("Content-Type", ct)
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
