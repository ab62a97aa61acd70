package push

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"

	"github.com/flamenet/relay/device"
)

// DefaultFCMURL is FCM's API host.
const DefaultFCMURL = "https://fcm.googleapis.com"

const (
	fcmScope = "https://www.googleapis.com/auth/firebase.messaging"
	// fcmRenewEarly is how long before it expires an access token is
	// replaced, so that none expires between fetching and sending.
	fcmRenewEarly = 5 * time.Minute
)

// fcm sends data-only, high-priority FCM HTTP v1 messages, authorised by
// an OAuth access token that a service account's signed JWT buys.
type fcm struct {
	sendURL string
	caller  *caller

	newTokens func() *tokenSource
	tokens    atomic.Pointer[tokenSource]

	// tokenLock is a one-slot semaphore rather than a mutex so that a
	// push whose deadline passes stops waiting for another's exchange.
	tokenLock chan struct{}
}

// tokenSource is a caching token source. Swapping in a new one is how a
// token that FCM refused is dropped, as oauth2's cache has no way to.
type tokenSource struct{ oauth2.TokenSource }

func newFCM(cfg FCMConfig, headerTimeout, attempt time.Duration) (*fcm, error) {
	raw, err := os.ReadFile(cfg.CredentialsFile)
	if err != nil {
		return nil, fmt.Errorf("push: FCM credentials: %w", err)
	}
	// The fields checked here are those oauth2 does not check, or checks
	// only at the first exchange: a bad file fails the start, not a push.
	var sa struct {
		ProjectID   string `json:"project_id"`
		PrivateKey  string `json:"private_key"`
		ClientEmail string `json:"client_email"`
		TokenURI    string `json:"token_uri"`
	}
	if err := json.Unmarshal(raw, &sa); err != nil {
		return nil, fmt.Errorf("push: FCM credentials %s: %w", cfg.CredentialsFile, err)
	}
	if sa.ProjectID == "" || sa.ClientEmail == "" || sa.PrivateKey == "" {
		return nil, fmt.Errorf("push: FCM credentials %s: project_id, client_email and private_key are required", cfg.CredentialsFile)
	}
	if _, err := parseRSAKey([]byte(sa.PrivateKey)); err != nil {
		return nil, fmt.Errorf("push: FCM credentials %s: private_key: %w", cfg.CredentialsFile, err)
	}
	// oauth2 would fall back to Google's endpoint; the relay's settings
	// promise the file's token_uri or FN_FCM_TOKEN_URL and nothing else.
	if sa.TokenURI == "" && cfg.TokenURL == "" {
		return nil, fmt.Errorf("push: FCM credentials %s: no token_uri and no token URL set", cfg.CredentialsFile)
	}
	jwtCfg, err := google.JWTConfigFromJSON(raw, fcmScope)
	if err != nil {
		return nil, fmt.Errorf("push: FCM credentials %s: %w", cfg.CredentialsFile, err)
	}
	if cfg.TokenURL != "" {
		jwtCfg.TokenURL = cfg.TokenURL // also the assertion's aud
	}
	base := cfg.URL
	if base == "" {
		base = DefaultFCMURL
	}
	c := newCaller(newTransport(cfg.RootCAs, headerTimeout), attempt)
	// oauth2 sends the token request without a context of ours, so the
	// client's Timeout is what bounds the whole exchange, as caller.call
	// bounds every other one.
	tokenClient := &http.Client{Transport: c.transport, CheckRedirect: c.client.CheckRedirect, Timeout: attempt}
	tokenCtx := context.WithValue(context.Background(), oauth2.HTTPClient, tokenClient)
	f := &fcm{
		sendURL: strings.TrimRight(base, "/") + "/v1/projects/" + url.PathEscape(sa.ProjectID) + "/messages:send",
		caller:  c,
		newTokens: func() *tokenSource {
			return &tokenSource{oauth2.ReuseTokenSourceWithExpiry(nil, jwtCfg.TokenSource(tokenCtx), fcmRenewEarly)}
		},
		tokenLock: make(chan struct{}, 1),
	}
	f.tokens.Store(f.newTokens())
	return f, nil
}

// accessToken returns the current token source and an access token from
// it, cached or newly exchanged. Only one exchange runs at a time; the
// other pushes wait for it and reuse its token. The exchange runs apart,
// bounded by the token client's timeout, so that a push whose ctx ends
// returns at once, and the token it was waiting for is still cached for
// the next push.
func (f *fcm) accessToken(ctx context.Context) (*tokenSource, string, error) {
	select {
	case f.tokenLock <- struct{}{}:
	case <-ctx.Done():
		return nil, "", fmt.Errorf("fcm: waiting for access token: %w", ctx.Err())
	}
	ts := f.tokens.Load()
	type result struct {
		tok *oauth2.Token
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer func() { <-f.tokenLock }()
		tok, err := ts.Token()
		done <- result{tok, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		return nil, "", fmt.Errorf("fcm: waiting for access token: %w", ctx.Err())
	}
	if r.err != nil {
		return nil, "", tokenError(r.err)
	}
	if r.tok.AccessToken == "" || r.tok.Expiry.IsZero() {
		f.forget(ts) // oauth2 would keep a token without expiry for ever
		return nil, "", errors.New("fcm: token endpoint answered without access_token and expires_in")
	}
	return ts, r.tok.AccessToken, nil
}

// forget replaces ts, and so drops its token, unless another push has
// replaced it already.
func (f *fcm) forget(ts *tokenSource) {
	f.tokens.CompareAndSwap(ts, f.newTokens())
}

// tokenError is a failed exchange as the queue takes it: the token
// endpoint's status, retried when the status says so, or the cause. The
// answer's body is left out: it is the endpoint's text, not the relay's.
func tokenError(err error) error {
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) || re.Response == nil {
		return fmt.Errorf("fcm: token request: %w", err)
	}
	se := &statusError{from: "fcm token endpoint", status: re.Response.StatusCode}
	if retryable(se.status) {
		return &RetryableError{Err: se, After: retryAfter(re.Response.Header, time.Now())}
	}
	return se
}

// fcmMessage is the whole request: a data-only message whose data is
// WakeBody's, at high priority so that Android wakes the app.
type fcmMessage struct {
	Message struct {
		Token   string            `json:"token"`
		Data    map[string]string `json:"data"`
		Android struct {
			Priority string `json:"priority"`
		} `json:"android"`
	} `json:"message"`
}

// FCMData is the data of every FCM message.
var FCMData = map[string]string{"wake": "1"}

func (f *fcm) Push(ctx context.Context, regToken string) error {
	if err := checkFCMToken(regToken); err != nil {
		return err
	}
	var m fcmMessage
	m.Message.Token = regToken
	m.Message.Data = FCMData
	m.Message.Android.Priority = "high"
	body, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("fcm: %w", err)
	}
	for try := 0; ; try++ {
		ts, tok, err := f.accessToken(ctx)
		if err != nil {
			return err
		}
		status, code, after, err := f.post(ctx, body, tok)
		if err != nil {
			return err
		}
		se := &statusError{from: device.PushFCM, status: status, reason: code}
		switch {
		case status == http.StatusOK:
			return nil
		// UNREGISTERED comes with a 404. A 404 that is not FCM's own
		// answer (no error body: a wrong URL, a proxy) must not clear
		// every device's target, so it is a plain failure.
		case code == "UNREGISTERED" || (status == http.StatusNotFound && code == "NOT_FOUND"):
			return fmt.Errorf("%w: %w", se, ErrGone)
		case status == http.StatusUnauthorized && try == 0:
			f.forget(ts) // revoked or expired early: once more with a new one
			continue
		case retryable(status):
			return &RetryableError{Err: se, After: after}
		default:
			return se
		}
	}
}

// post sends one message and returns the status and FCM's error code.
func (f *fcm) post(ctx context.Context, body []byte, accessToken string) (int, string, time.Duration, error) {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+accessToken)
	h.Set("Content-Type", "application/json")
	ans, err := f.caller.call(ctx, http.MethodPost, f.sendURL, body, h)
	if err != nil {
		return 0, "", 0, fmt.Errorf("fcm: %w", err)
	}
	var answer struct {
		Error struct {
			Status  string `json:"status"`
			Details []struct {
				ErrorCode string `json:"errorCode"`
			} `json:"details"`
		} `json:"error"`
	}
	_ = json.Unmarshal(ans.body, &answer) // a success has no error; an odd answer just has no code
	code := answer.Error.Status
	for _, d := range answer.Error.Details {
		if d.ErrorCode != "" {
			code = d.ErrorCode // the FCM-specific code is the precise one
		}
	}
	return ans.status, code, retryAfter(ans.header, time.Now()), nil
}

func (f *fcm) Close() { f.caller.close() }
