package client

import (
	"encoding/json"
	"mime"

	"github.com/vmihailenco/msgpack/v5"
)

// Codec encodes request bodies and decodes answers. The relay speaks JSON
// and MessagePack with the same field names (docs/PROTOCOL.md, Encoding).
type Codec interface {
	// ContentType is sent as Content-Type of bodies and as Accept.
	ContentType() string
	Marshal(v any) ([]byte, error)
	Unmarshal(b []byte, v any) error
}

// JSON is the default codec: bytes travel as standard base64 strings.
var JSON Codec = jsonCodec{}

// MessagePack sends and asks for application/msgpack: bytes travel as bin,
// which saves the base64 third.
var MessagePack Codec = msgpackCodec{}

type jsonCodec struct{}

func (jsonCodec) ContentType() string             { return "application/json" }
func (jsonCodec) Marshal(v any) ([]byte, error)   { return json.Marshal(v) }
func (jsonCodec) Unmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

type msgpackCodec struct{}

func (msgpackCodec) ContentType() string             { return "application/msgpack" }
func (msgpackCodec) Marshal(v any) ([]byte, error)   { return msgpack.Marshal(v) }
func (msgpackCodec) Unmarshal(b []byte, v any) error { return msgpack.Unmarshal(b, v) }

// codecFor picks the decoder by the answer's own Content-Type, so an answer
// in the other codec (a proxy's error page aside) still reads.
func codecFor(contentType string) Codec {
	mt, _, err := mime.ParseMediaType(contentType)
	if err == nil && (mt == "application/msgpack" || mt == "application/x-msgpack") {
		return MessagePack
	}
	return JSON
}
