package push

import (
	"context"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/flamenet/relay/device"
)

// DefaultFCMURL is FCM's API host.
const DefaultFCMURL = "https://fcm.googleapis.com"

const (
	fcmScope     = "https://www.googleapis.com/auth/firebase.messaging"
	jwtBearer    = "urn:ietf:params:oauth:grant-type:jwt-bearer"
	fcmAssertion = time.Hour // lifetime of the signed assertion
)

// fcm sends data-only, high-priority FCM HTTP v1 messages, authorised by
// an OAuth access token that a service account's signed JWT buys.
type fcm struct {
	sendURL  string
	tokenURL string
	email    string
	keyID    string
	key      *rsa.PrivateKey
	caller   *caller
	now      func() time.Time

	// tokenLock is a one-slot semaphore rather than a mutex so that a
	// push whose deadline passes stops waiting for another's exchange.
	tokenLock chan struct{}
	token     string
	renewAt   time.Time
}

// serviceAccount is the part of a Google service-account JSON file FCM
// needs.
type serviceAccount struct {
	ProjectID    string `json:"project_id"`
	PrivateKeyID string `json:"private_key_id"`
	PrivateKey   string `json:"private_key"`
	ClientEmail  string `json:"client_email"`
	TokenURI     string `json:"token_uri"`
}

func newFCM(cfg FCMConfig, headerTimeout, attempt time.Duration) (*fcm, error) {
	raw, err := os.ReadFile(cfg.CredentialsFile)
	if err != nil {
		return nil, fmt.Errorf("push: FCM credentials: %w", err)
	}
	var sa serviceAccount
	if err := json.Unmarshal(raw, &sa); err != nil {
		return nil, fmt.Errorf("push: FCM credentials %s: %w", cfg.CredentialsFile, err)
	}
	if sa.ProjectID == "" || sa.ClientEmail == "" || sa.PrivateKey == "" {
		return nil, fmt.Errorf("push: FCM credentials %s: project_id, client_email and private_key are required", cfg.CredentialsFile)
	}
	key, err := parseRSAKey([]byte(sa.PrivateKey))
	if err != nil {
		return nil, fmt.Errorf("push: FCM credentials %s: private_key: %w", cfg.CredentialsFile, err)
	}
	tokenURL := cfg.TokenURL
	if tokenURL == "" {
		tokenURL = sa.TokenURI
	}
	if tokenURL == "" {
		return nil, fmt.Errorf("push: FCM credentials %s: no token_uri and no token URL set", cfg.CredentialsFile)
	}
	base := cfg.URL
	if base == "" {
		base = DefaultFCMURL
	}
	return &fcm{
		sendURL:   strings.TrimRight(base, "/") + "/v1/projects/" + url.PathEscape(sa.ProjectID) + "/messages:send",
		tokenURL:  tokenURL,
		email:     sa.ClientEmail,
		keyID:     sa.PrivateKeyID,
		key:       key,
		caller:    newCaller(newTransport(cfg.RootCAs, headerTimeout), attempt),
		now:       time.Now,
		tokenLock: make(chan struct{}, 1),
	}, nil
}

// accessToken returns the cached access token or exchanges a new
// assertion for one. Only one exchange runs at a time; the others wait for
// it and reuse its token.
func (f *fcm) accessToken(ctx context.Context) (string, error) {
	select {
	case f.tokenLock <- struct{}{}:
	case <-ctx.Done():
		return "", fmt.Errorf("fcm: waiting for access token: %w", ctx.Err())
	}
	defer func() { <-f.tokenLock }()
	if f.token != "" && f.now().Before(f.renewAt) {
		return f.token, nil
	}
	tok, lifetime, err := f.exchange(ctx)
	if err != nil {
		return "", err
	}
	// Renew shortly before it expires: five minutes early, or at half
	// its life when it is short.
	early := min(5*time.Minute, lifetime/2)
	f.token, f.renewAt = tok, f.now().Add(lifetime-early)
	return tok, nil
}

// forget drops tok if it is still the cached one (the API refused it).
func (f *fcm) forget(ctx context.Context, tok string) {
	select {
	case f.tokenLock <- struct{}{}:
	case <-ctx.Done():
		return // the push is over; the next one finds out again
	}
	if f.token == tok {
		f.token = ""
	}
	<-f.tokenLock
}

func (f *fcm) exchange(ctx context.Context) (string, time.Duration, error) {
	now := f.now()
	header := map[string]string{"alg": "RS256", "typ": "JWT"}
	if f.keyID != "" {
		header["kid"] = f.keyID
	}
	assertion, err := signJWT(header, map[string]any{
		"iss":   f.email,
		"scope": fcmScope,
		"aud":   f.tokenURL,
		"iat":   now.Unix(),
		"exp":   now.Add(fcmAssertion).Unix(),
	}, rs256(f.key))
	if err != nil {
		return "", 0, fmt.Errorf("fcm: assertion: %w", err)
	}
	form := url.Values{"grant_type": {jwtBearer}, "assertion": {assertion}}
	h := http.Header{}
	h.Set("Content-Type", "application/x-www-form-urlencoded")
	ans, err := f.caller.call(ctx, http.MethodPost, f.tokenURL, []byte(form.Encode()), h)
	if err != nil {
		return "", 0, fmt.Errorf("fcm: token request: %w", err)
	}
	if ans.status != http.StatusOK {
		err := &statusError{from: "fcm token endpoint", status: ans.status}
		if retryable(ans.status) {
			return "", 0, &RetryableError{Err: err, After: retryAfter(ans.header, f.now())}
		}
		return "", 0, err
	}
	var answer struct {
		AccessToken string `json:"access_token"`
		ExpiresIn   int64  `json:"expires_in"`
	}
	if err := json.Unmarshal(ans.body, &answer); err != nil || answer.AccessToken == "" || answer.ExpiresIn <= 0 {
		return "", 0, fmt.Errorf("fcm: token endpoint answered without access_token and expires_in")
	}
	return answer.AccessToken, time.Duration(answer.ExpiresIn) * time.Second, nil
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
		tok, err := f.accessToken(ctx)
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
			f.forget(ctx, tok) // revoked or expired early: once more with a new one
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
	return ans.status, code, retryAfter(ans.header, f.now()), nil
}

func (f *fcm) Close() { f.caller.close() }
