package webpush

import (
	"bytes"
	"crypto/ecdh"
	"encoding/base64"
	"errors"
	"testing"
)

func b64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRFC8291Example: RFC 8291 appendix A's sender key, salt, subscription
// and message encrypt to exactly the RFC's body.
func TestRFC8291Example(t *testing.T) {
	sender, err := ecdh.P256().NewPrivateKey(b64(t, "yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw"))
	if err != nil {
		t.Fatal(err)
	}
	if got := base64.RawURLEncoding.EncodeToString(sender.PublicKey().Bytes()); got != "BP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A8" {
		t.Fatalf("the example's sender public key: %s", got)
	}
	sub := Subscription{
		P256dh: b64(t, "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"),
		Auth:   b64(t, "BTBZMqHH6r4Tts7J_aSIgg"),
	}
	body, err := encrypt(sub, []byte("When I grow up, I want to be a watermelon"), 0, sender, b64(t, "DGv6ra1nlYgDCS1FRnbzlw"))
	if err != nil {
		t.Fatal(err)
	}
	want := "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN"
	if got := base64.RawURLEncoding.EncodeToString(body); got != want {
		t.Fatalf("body:\n%s\nwant\n%s", got, want)
	}
}

// TestEncryptPads: a padded body is as long as asked whatever the
// message, and two bodies of one message differ (a fresh key and salt).
func TestEncryptPads(t *testing.T) {
	ua, _ := ecdh.P256().GenerateKey(nil)
	sub := Subscription{P256dh: ua.PublicKey().Bytes(), Auth: bytes.Repeat([]byte{7}, 16)}
	a, err := Encrypt(sub, []byte("x"), 100)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Encrypt(sub, []byte("a longer one"), 100)
	if len(a) != headerSize+100+1+tagSize || len(b) != len(a) {
		t.Errorf("padded bodies of %d and %d bytes, want %d", len(a), len(b), headerSize+101+tagSize)
	}
	c, _ := Encrypt(sub, []byte("x"), 100)
	if bytes.Equal(a, c) {
		t.Error("two bodies of one message are equal")
	}
}

// TestCheck: keys that cannot be encrypted to are refused, naming the field.
func TestCheck(t *testing.T) {
	ua, _ := ecdh.P256().GenerateKey(nil)
	good := ua.PublicKey().Bytes()
	offCurve := bytes.Clone(good)
	offCurve[64] ^= 1
	for _, s := range []Subscription{
		{P256dh: good[:64], Auth: make([]byte, 16)},
		{P256dh: offCurve, Auth: make([]byte, 16)},
		{P256dh: append([]byte{2}, good[1:33]...), Auth: make([]byte, 16)},
		{P256dh: good, Auth: make([]byte, 15)},
	} {
		if err := s.Check(); !errors.Is(err, ErrKey) {
			t.Errorf("%x/%x: %v, want ErrKey", s.P256dh, s.Auth, err)
		}
		if _, err := Encrypt(s, []byte("x"), 0); !errors.Is(err, ErrKey) {
			t.Errorf("Encrypt to %x: %v", s.P256dh, err)
		}
	}
	if err := (Subscription{P256dh: good, Auth: make([]byte, 16)}).Check(); err != nil {
		t.Error(err)
	}
}
