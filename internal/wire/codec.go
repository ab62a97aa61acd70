package wire

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
)

// The API's media types.
const (
	ContentJSON    = "application/json"
	ContentMsgpack = "application/msgpack"
)

func isMsgpack(mediaType string) bool {
	mt, _, err := mime.ParseMediaType(mediaType)
	return err == nil && (mt == ContentMsgpack || mt == "application/x-msgpack")
}

// WantsMsgpack says whether the client asks for MessagePack: a response is
// MessagePack only then.
func WantsMsgpack(r *http.Request) bool {
	for _, a := range r.Header.Values("Accept") {
		for _, part := range bytes.Split([]byte(a), []byte(",")) {
			if isMsgpack(string(bytes.TrimSpace(part))) {
				return true
			}
		}
	}
	return false
}

// ReadBody reads at most limit bytes of the body; more is a 413.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return nil, Errorf(http.StatusRequestEntityTooLarge, "The request body is larger than %d bytes.", limit)
	case err != nil:
		return nil, badRequest("The request body could not be read.")
	}
	return b, nil
}

// DecodeRequest decodes a JSON or MessagePack body into v. An empty body
// leaves v as it is. Unknown fields are ignored.
func DecodeRequest(r *http.Request, body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if isMsgpack(r.Header.Get("Content-Type")) {
		if err := checkMsgpack(body); err != nil {
			return badRequest("The MessagePack body is not valid: %s", err)
		}
		d := msgpack.NewDecoder(bytes.NewReader(body))
		if err := d.Decode(v); err != nil {
			return badRequest("The MessagePack body is not valid: %s", cleanDecodeError(err))
		}
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(body))
	if err := d.Decode(v); err != nil {
		var ce base64.CorruptInputError
		if errors.As(err, &ce) {
			// encoding/json does not say which field: the request types
			// have one field of bytes each.
			return badRequest("The JSON body is not valid: field %s is not standard base64 (RFC 4648, with padding): bad character at offset %d.", quote(bytesField(v)), int64(ce))
		}
		return badRequest("The JSON body is not valid: %s", cleanDecodeError(err))
	}
	if _, err := d.Token(); err != io.EOF {
		return badRequest("The JSON body has data after its end.")
	}
	return nil
}

// maxMsgpackDepth is how deeply MessagePack arrays and maps may nest; the
// request's own map is level 1. The decoder skips unknown fields by
// recursion, so each level costs stack.
const maxMsgpackDepth = 32

var (
	errMsgpackShort    = errors.New("unexpected end of body")
	errMsgpackTrailing = errors.New("data after the value")
	errMsgpackUnused   = errors.New("byte 0xc1 is not a MessagePack type")
	errMsgpackTooLong  = errors.New("a length or count larger than the body")
	errMsgpackTooDeep  = errors.New("nesting deeper than 32 levels")
)

// checkMsgpack walks the one MessagePack value that b must hold, without
// decoding or allocating, and refuses what would make the decoder spend
// more than the body pays for. The decoder allocates a bin's declared length
// and up to a million slots of an array's count before it reads a byte (no
// option turns that off), and recurses once per level, so: every declared
// length fits in the bytes left, every count too (a value takes at least
// one byte), arrays and maps nest at most maxMsgpackDepth deep, and the
// value ends where b ends. Ext data is opaque bytes to the decoder, so an
// ext is not a level.
func checkMsgpack(b []byte) error {
	var left [maxMsgpackDepth + 1]uint64 // values still to come in each open array or map
	left[0] = 1
	depth, i := 0, 0
	for {
		for left[depth] == 0 {
			if depth == 0 {
				if i < len(b) {
					return errMsgpackTrailing
				}
				return nil
			}
			depth--
		}
		left[depth]--
		if i == len(b) {
			return errMsgpackShort
		}
		kind, lenBytes, n := msgpackHead(b[i])
		i++
		if kind == mpUnused {
			return errMsgpackUnused
		}
		if len(b)-i < lenBytes {
			return errMsgpackShort
		}
		var declared uint64
		for _, x := range b[i : i+lenBytes] {
			declared = declared<<8 | uint64(x)
		}
		n += declared
		i += lenBytes
		if kind == mpMap {
			n *= 2 // a key and a value per entry
		}
		if n > uint64(len(b)-i) {
			return errMsgpackTooLong
		}
		if kind == mpData {
			i += int(n)
			continue
		}
		if depth == maxMsgpackDepth {
			return errMsgpackTooDeep
		}
		depth++
		left[depth] = n
	}
}

type mpKind int

const (
	mpData   mpKind = iota // n bytes follow
	mpArray                // n values follow
	mpMap                  // n key-value pairs follow
	mpUnused               // 0xc1, never used
)

// msgpackHead reads a value's first byte: its kind, how many big-endian
// length bytes follow it, and n, what a fix type carries in the byte or
// implies (for ext, the type byte that comes on top of the length).
func msgpackHead(c byte) (kind mpKind, lenBytes int, n uint64) {
	switch {
	case c <= 0x7f || c >= 0xe0: // fixint
		return mpData, 0, 0
	case c <= 0x8f:
		return mpMap, 0, uint64(c & 0x0f)
	case c <= 0x9f:
		return mpArray, 0, uint64(c & 0x0f)
	case c <= 0xbf: // fixstr
		return mpData, 0, uint64(c & 0x1f)
	case c == 0xc1:
		return mpUnused, 0, 0
	case c <= 0xc3: // nil, false, true
		return mpData, 0, 0
	case c <= 0xc6: // bin 8, 16, 32
		return mpData, 1 << (c - 0xc4), 0
	case c <= 0xc9: // ext 8, 16, 32
		return mpData, 1 << (c - 0xc7), 1
	case c <= 0xcb: // float 32, 64
		return mpData, 0, 4 << (c - 0xca)
	case c <= 0xcf: // uint 8 to 64
		return mpData, 0, 1 << (c - 0xcc)
	case c <= 0xd3: // int 8 to 64
		return mpData, 0, 1 << (c - 0xd0)
	case c <= 0xd8: // fixext 1 to 16, plus the type byte
		return mpData, 0, 1 + 1<<(c-0xd4)
	case c <= 0xdb: // str 8, 16, 32
		return mpData, 1 << (c - 0xd9), 0
	case c <= 0xdd: // array 16, 32
		return mpArray, 2 << (c - 0xdc), 0
	default: // map 16, 32
		return mpMap, 2 << (c - 0xde), 0
	}
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

// bytesField returns the JSON name of the field of bytes in the struct v points
// to ([]byte, or a pointer to one), for an error that names it.
func bytesField(v any) string {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return "?"
	}
	bytesType := reflect.TypeFor[[]byte]()
	for f := range t.Fields() {
		if f.Type == bytesType || (f.Type.Kind() == reflect.Pointer && f.Type.Elem() == bytesType) {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			return name
		}
	}
	return "?"
}

// Marshal encodes v as the client asked (JSON unless it accepts
// MessagePack), and says as which.
func Marshal(r *http.Request, v any) (b []byte, contentType string, err error) {
	if WantsMsgpack(r) {
		b, err = msgpack.Marshal(v)
		return b, ContentMsgpack, err
	}
	b, err = json.Marshal(v)
	return append(b, '\n'), ContentJSON, err
}

func badRequest(format string, args ...any) *Error {
	return Errorf(http.StatusBadRequest, format, args...)
}
