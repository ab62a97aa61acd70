package push

import (
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flamenet/relay/device"
)

// DefaultAPNsURL is APNs production; the sandbox is
// https://api.sandbox.push.apple.com.
const DefaultAPNsURL = "https://api.push.apple.com"

const (
	// APNsBody is the whole body of every APNs push: a background
	// notification that lets the app run and poll, with nothing in it.
	APNsBody = `{"aps":{"content-available":1}}`
	// APNsAlertPrefix marks an APNs target that asked for alert pushes:
	// the address is the prefix and the device token.
	APNsAlertPrefix = "alert:"
	// DefaultAPNsAlertText is an alert push's text when FN_APNS_ALERT_TEXT
	// is not set: shown only when the app's Notification Service
	// Extension cannot run (it replaces the text with the message).
	DefaultAPNsAlertText = "New message"
	// apnsCollapseID: one pending wake per device is enough, a newer one
	// replaces it (collapse ids apply per device token).
	apnsCollapseID = "fn-wake"
	// APNs rejects a provider token older than an hour and one renewed
	// more often than every 20 minutes; renew well inside both bounds.
	apnsTokenRenew  = 50 * time.Minute
	apnsTokenMinAge = 20 * time.Minute
	apnsExpiration  = 24 * time.Hour
)

// apns sends background or alert pushes over HTTP/2 with token-based
// auth.
type apns struct {
	url       string
	keyID     string
	teamID    string
	topic     string
	alertBody []byte // the body of every alert push
	key       *ecdsa.PrivateKey
	caller    *caller
	now       func() time.Time

	mu     sync.Mutex
	token  string
	issued time.Time
}

func newAPNs(cfg APNsConfig, headerTimeout, attempt time.Duration) (*apns, error) {
	if cfg.KeyID == "" || cfg.TeamID == "" || cfg.Topic == "" {
		return nil, fmt.Errorf("push: APNs needs a key id, team id and topic with its key file")
	}
	pemBytes, err := os.ReadFile(cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("push: APNs key: %w", err)
	}
	key, err := parseP256Key(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("push: APNs key %s: %w", cfg.KeyFile, err)
	}
	base := cfg.URL
	if base == "" {
		base = DefaultAPNsURL
	}
	text := cfg.AlertText
	if text == "" {
		text = DefaultAPNsAlertText
	}
	alert, err := apnsAlertBody(text)
	if err != nil {
		return nil, err
	}
	return &apns{
		alertBody: alert,
		url:       strings.TrimRight(base, "/"),
		keyID:     cfg.KeyID,
		teamID:    cfg.TeamID,
		topic:     cfg.Topic,
		key:       key,
		caller:    newCaller(newTransport(cfg.RootCAs, headerTimeout), attempt),
		now:       time.Now,
	}, nil
}

// providerToken returns the cached provider JWT, signing a new one when it
// is due for renewal.
func (a *apns) providerToken() (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if a.token != "" && now.Sub(a.issued) < apnsTokenRenew {
		return a.token, nil
	}
	tok, err := signJWT(
		map[string]string{"alg": "ES256", "kid": a.keyID},
		map[string]any{"iss": a.teamID, "iat": now.Unix()},
		es256(a.key))
	if err != nil {
		return "", fmt.Errorf("apns: provider token: %w", err)
	}
	a.token, a.issued = tok, now
	return tok, nil
}

// expire drops tok if it is still the cached one and old enough that APNs
// allows a new one; it reports whether it did.
func (a *apns) expire(tok string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.token != tok || a.now().Sub(a.issued) < apnsTokenMinAge {
		return false
	}
	a.token = ""
	return true
}

// apnsAlertBody is an alert push's body: the operator's generic text,
// and mutable-content, which lets the app's Notification Service
// Extension run, fetch the envelopes and show them instead.
func apnsAlertBody(text string) ([]byte, error) {
	return json.Marshal(map[string]any{"aps": map[string]any{"alert": map[string]string{"body": text}, "mutable-content": 1}})
}

func (a *apns) Push(ctx context.Context, address string) error {
	deviceToken, alert := strings.CutPrefix(address, APNsAlertPrefix)
	if err := checkAPNsToken(deviceToken); err != nil {
		return err
	}
	for try := 0; ; try++ {
		tok, err := a.providerToken()
		if err != nil {
			return err
		}
		status, reason, after, err := a.post(ctx, deviceToken, tok, alert)
		if err != nil {
			return err
		}
		se := &statusError{from: device.PushAPNs, status: status, reason: reason}
		switch {
		case status == http.StatusOK:
			return nil
		case status == http.StatusGone || reason == "Unregistered" ||
			(status == http.StatusBadRequest && reason == "BadDeviceToken"):
			return fmt.Errorf("%w: %w", se, ErrGone)
		case status == http.StatusForbidden && reason == "ExpiredProviderToken" && try == 0 && a.expire(tok):
			continue // once, with a fresh token
		case retryable(status):
			return &RetryableError{Err: se, After: after}
		default:
			return se
		}
	}
}

// post sends one push. Its errors never name the URL, which holds the
// device token.
func (a *apns) post(ctx context.Context, deviceToken, providerToken string, alert bool) (status int, reason string, after time.Duration, err error) {
	h := http.Header{}
	h.Set("Authorization", "bearer "+providerToken)
	h.Set("Content-Type", "application/json")
	body := []byte(APNsBody)
	if alert {
		// Delivered at once, even to an app the user swiped away; the
		// extension has about 30 s to replace the text.
		h.Set("apns-push-type", "alert")
		h.Set("apns-priority", "10")
		body = a.alertBody
	} else {
		h.Set("apns-push-type", "background")
		h.Set("apns-priority", "5") // background pushes must not use 10
	}
	h.Set("apns-topic", a.topic)
	h.Set("apns-expiration", strconv.FormatInt(a.now().Add(apnsExpiration).Unix(), 10))
	h.Set("apns-collapse-id", apnsCollapseID)
	ans, err := a.caller.call(ctx, http.MethodPost, a.url+"/3/device/"+deviceToken, body, h)
	if err != nil {
		return 0, "", 0, fmt.Errorf("apns: %w", err)
	}
	var answer struct {
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(ans.body, &answer) // a 200 has no body; an odd one just has no reason
	return ans.status, answer.Reason, retryAfter(ans.header, a.now()), nil
}

func (a *apns) Close() { a.caller.close() }
