package hostile

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
)

// The pairing endpoints take requests without a token: a code or a renewal
// secret is the only credential, so a hostile client can guess at them as
// fast as it likes. Every guess must be refused, each refusal the same
// (pairRefusal), and floods must meet the pair buckets (429), while the
// load beside them goes on.

// pairRefusal is the one body every wrong code or secret gets.
const pairRefusal = `{"error":"unauthorized","message":"The code or renewal secret is not valid."}`

// crockford is the alphabet of invitation codes.
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// guessCode is a code of the right shape, drawn at random.
func guessCode() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	out := make([]byte, 0, 11)
	for i, v := range b {
		if i == 5 {
			out = append(out, '-')
		}
		out = append(out, crockford[int(v)%len(crockford)])
	}
	return string(out)
}

// guessSecret is a renewal secret of the right shape, drawn at random.
func guessSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return "fnr1." + base64.RawURLEncoding.EncodeToString(b[:])
}

type pairRequest struct {
	Code        string `json:"code"`
	IdentityKey string `json:"identity_key,omitempty"`
}

type renewRequest struct {
	Secret string `json:"renewal_secret"`
}

// guess sends one guess, judged by judgeGuess.
func (w *hworker) guess(ctx context.Context, kind, path string, body any) {
	b, _ := json.Marshal(body)
	w.quickJudged(ctx, kind, rawRequest(http.MethodPost, path, []string{"Content-Type: application/json"}, b), true, judgeGuess)
}

// judgeGuess names what fails the run in the answer to a guess, beyond its
// acceptance (answerOutcome): any answer but the one refusal, a 429 from a
// pair bucket, or a 503.
func judgeGuess(resp *http.Response, body []byte) string {
	switch {
	case resp.StatusCode/100 == 2, resp.StatusCode == http.StatusServiceUnavailable:
		return ""
	case resp.StatusCode == http.StatusUnauthorized:
		if !bytes.Equal(bytes.TrimSpace(body), []byte(pairRefusal)) {
			return "a refusal unlike the others"
		}
	case resp.StatusCode == http.StatusTooManyRequests:
		if l := errorLimit(body); l != "pair_address_rate" && l != "pair_rate" {
			return "429 from another bucket (" + l + ")"
		}
	default:
		return "answered " + strconv.Itoa(resp.StatusCode) + " to a guess"
	}
	return ""
}

// judgeStatus is a judge that takes only status: a web page's request,
// refused before any budget.
func judgeStatus(status int) func(*http.Response, []byte) string {
	return func(resp *http.Response, _ []byte) string {
		if resp.StatusCode != status {
			return "answered " + strconv.Itoa(resp.StatusCode) + ", want " + strconv.Itoa(status)
		}
		return ""
	}
}

// pageOrigin is the origin of the hostile web page: not the relay's, not
// in FN_CORS_ORIGINS.
const pageOrigin = "Origin: https://hostile-page.example"

var pairingKinds = []hostileKind{
	{"pair, guessed code", func(ctx context.Context, w *hworker, kind string) {
		w.guess(ctx, kind, "/v1/pair", pairRequest{Code: guessCode()})
	}},
	{"renew, guessed secret", func(ctx context.Context, w *hworker, kind string) {
		w.guess(ctx, kind, "/v1/renew", renewRequest{Secret: guessSecret()})
	}},
	{"pair flood, 30 guesses", func(ctx context.Context, w *hworker, kind string) {
		for range 30 {
			if ctx.Err() != nil {
				return
			}
			w.guess(ctx, kind, "/v1/pair", pairRequest{Code: guessCode()})
		}
	}},
	{"pair, a web page's text/plain post", func(ctx context.Context, w *hworker, kind string) {
		b, _ := json.Marshal(pairRequest{Code: guessCode()})
		req := rawRequest(http.MethodPost, "/v1/pair", []string{"Content-Type: text/plain;charset=UTF-8", pageOrigin}, b)
		w.quickJudged(ctx, kind, req, true, judgeStatus(http.StatusUnsupportedMediaType))
	}},
	{"renew, a web page of another origin", func(ctx context.Context, w *hworker, kind string) {
		b, _ := json.Marshal(renewRequest{Secret: guessSecret()})
		req := rawRequest(http.MethodPost, "/v1/renew", []string{"Content-Type: application/json", pageOrigin}, b)
		w.quickJudged(ctx, kind, req, true, judgeStatus(http.StatusForbidden))
	}},
	{"pair, body over 1 KiB", func(ctx context.Context, w *hworker, kind string) {
		b, _ := json.Marshal(pairRequest{Code: guessCode(), IdentityKey: string(bytes.Repeat([]byte("A"), 4096))})
		w.quick(ctx, kind, rawRequest(http.MethodPost, "/v1/pair", []string{"Content-Type: application/json"}, b), true)
	}},
	{"renew, body not JSON", func(ctx context.Context, w *hworker, kind string) {
		w.quick(ctx, kind, rawRequest(http.MethodPost, "/v1/renew", []string{"Content-Type: application/json"}, []byte(`{"renewal_secret":`)), true)
	}},
	{"pair body stalls halfway", func(ctx context.Context, w *hworker, kind string) {
		b, _ := json.Marshal(pairRequest{Code: guessCode()})
		req := rawRequest(http.MethodPost, "/v1/pair", []string{"Content-Type: application/json", "Content-Length: " + strconv.Itoa(len(b))}, nil)
		w.stall(ctx, kind, append(req, b[:len(b)/2]...), true)
	}},
	{"invitation with a device token", func(ctx context.Context, w *hworker, kind string) {
		w.quick(ctx, kind, rawRequest(http.MethodPost, "/v1/invitations", w.jsonHeaders(), []byte(`{"device":"intruder","scope":"admin"}`)), true)
	}},
}
