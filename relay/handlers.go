package relay

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/edkey"
	"github.com/flamenet/relay/internal/memory"
	"github.com/flamenet/relay/internal/wire"
	"github.com/flamenet/relay/push"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/token"
	"github.com/flamenet/relay/wake"
)

type handlerFunc func(w http.ResponseWriter, r *http.Request, c *token.Claims) error

// authed verifies the bearer token, checks the names it carries and that its
// device was not removed after it was issued, then runs h and turns its
// error into the protocol's error body.
func (s *Server) authed(h handlerFunc) http.HandlerFunc { return s.authedOn(h, false) }

// authedHolding is authed for a handler that may hold its goroutine (a
// poll): the token's signature is checked on a goroutine of its own (see
// offload), so that the held stack stays small. Other requests check it on
// their own goroutine, which spares a goroutine and its stack's growth.
func (s *Server) authedHolding(h handlerFunc) http.HandlerFunc { return s.authedOn(h, true) }

func (s *Server) authedOn(h handlerFunc, holds bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// One store deadline for the whole request, the token's check
		// included: several store calls must not add up past it.
		startStoreBudget(r.Context(), s.cfg.StoreTimeout)
		c, err := s.authenticate(r, holds)
		if err == nil {
			err = h(w, r, c)
			if errors.Is(err, store.ErrRemoved) {
				// The store, or what was read from it, knew of a removal
				// that memory had not heard of when the token was checked.
				notePoll(r.Context(), pollRemoved)
				err = s.refuseToken(r, refusedRemoved, nil)
			}
		} else if rs := resumeOf(r.Context()); rs != nil && errors.Is(rs.Err, wake.ErrRemoved) {
			// A parked poll whose device was removed: its token is now
			// refused, as a held one's is.
			notePoll(r.Context(), pollRemoved)
		}
		if err != nil && err != errParked {
			s.writeError(w, r, err)
		}
	}
}

func (s *Server) authenticate(r *http.Request, holds bool) (*token.Claims, error) {
	raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || len(r.Header.Values("Authorization")) != 1 {
		return nil, s.refuseToken(r, refusedMissing, nil)
	}
	raw = strings.TrimSpace(raw)
	now := s.now()
	if rs := resumeOf(r.Context()); rs != nil {
		now = rs.Checked // a parked poll, read again: judged as when it came
	}
	c, ok := s.verified.get(raw, now)
	if !ok {
		verify := func() (token.Claims, error) { return token.Verify(raw, s.keys, now) }
		var (
			v   token.Claims
			err error
		)
		if holds {
			v, err = offload(verify)
		} else {
			v, err = verify()
		}
		if err != nil {
			return nil, s.refuseToken(r, tokenRefusal(err), err)
		}
		c = &v
		s.verified.put(raw, c)
	}
	if !device.ValidName(c.Household) || !device.ValidName(c.Device) {
		return nil, badRequest("The token's household or device name is not 1 to 64 characters of A-Z a-z 0-9 . _ -.")
	}
	noteDevice(r.Context(), c.Household, c.Device)
	life, err := s.life(r.Context(), c)
	if err != nil {
		return nil, err
	}
	if !life.Admits(c.IssuedAt) {
		return nil, s.refuseToken(r, refusedRemoved, nil)
	}
	return c, nil
}

// life is the token's device's current life: from memory, which the hub
// keeps current on every relay, or read from the store. Memory may not have
// heard of a removal yet, so whatever creates, registers or acknowledges
// for the device checks the token again, in the store (issuedAt) or against
// the life the store read.
func (s *Server) life(ctx context.Context, c *token.Claims) (device.Life, error) {
	key := c.Key()
	if life, ok := s.memory.KnownLife(key); ok {
		return life, nil
	}
	return offload(func() (device.Life, error) {
		ctx, cancel := s.storeCtx(ctx)
		defer cancel()
		return s.memory.Life(ctx, key)
	})
}

// issuedAt is when the token was issued, as the store checks it against
// the device's removals: a token without iat is older than any removal.
func issuedAt(c *token.Claims) time.Time {
	if c.IssuedAt.IsZero() {
		return time.Unix(0, 0)
	}
	return c.IssuedAt
}

// Why a token was refused, as fn_tokens_refused_total counts it.
const (
	refusedMissing   = "missing"
	refusedMalformed = "malformed"
	refusedAlgorithm = "algorithm"
	refusedSignature = "signature"
	refusedClaims    = "claims"
	refusedExpired   = "expired"
	refusedNotYet    = "not_yet_valid"
	refusedRemoved   = "removed"
)

var tokenRefusalReasons = []string{refusedMissing, refusedMalformed, refusedAlgorithm, refusedSignature,
	refusedClaims, refusedExpired, refusedNotYet, refusedRemoved}

func tokenRefusal(err error) string {
	switch {
	case errors.Is(err, token.ErrAlgorithm):
		return refusedAlgorithm
	case errors.Is(err, token.ErrSignature):
		return refusedSignature
	case errors.Is(err, token.ErrClaims), errors.Is(err, token.ErrUnknownScope):
		return refusedClaims
	case errors.Is(err, token.ErrExpired):
		return refusedExpired
	case errors.Is(err, token.ErrNotYetValid), errors.Is(err, token.ErrFutureIssue):
		return refusedNotYet
	}
	return refusedMalformed // ErrMalformed, ErrTooLong
}

// refuseToken counts a refused token and answers 401. Anyone can send bad
// tokens, so the log gets the first and then at most one line per
// interval, with the running count.
func (s *Server) refuseToken(r *http.Request, reason string, err error) error {
	s.metrics.tokensRefused.WithLabelValues(reason).Inc()
	total := s.logs.tokensRefused.Add(1)
	s.logs.refusedLog.Do(func() {
		attrs := []slog.Attr{slog.String("reason", reason), slog.String("path", r.URL.Path), slog.Uint64("refused_total", total)}
		if err != nil {
			attrs = append(attrs, slog.String("err", err.Error()))
		}
		s.log.LogAttrs(r.Context(), slog.LevelInfo, "token refused", attrs...)
	})
	return errUnauthorized
}

// storeCtx bounds a store call by the request's store deadline (see
// startStoreBudget), or by FN_STORE_TIMEOUT outside a request.
func (s *Server) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if rec := recordOf(ctx); rec != nil && !rec.storeDeadline.IsZero() {
		return context.WithDeadline(ctx, rec.storeDeadline)
	}
	return context.WithTimeout(ctx, s.cfg.StoreTimeout)
}

// startStoreBudget gives the store calls of ctx's request, together,
// timeout from now. A held poll starts it again when it wakes: its hold is
// not store time.
func startStoreBudget(ctx context.Context, timeout time.Duration) {
	if rec := recordOf(ctx); rec != nil {
		rec.storeDeadline = time.Now().Add(timeout)
	}
}

type pushRequest struct {
	Kind     string `json:"kind" msgpack:"kind"`
	Endpoint string `json:"endpoint" msgpack:"endpoint"`
	Token    string `json:"token" msgpack:"token"`
	// Alert asks APNs for alert pushes with mutable-content, which a
	// Notification Service Extension opens, instead of background pushes.
	Alert bool `json:"alert" msgpack:"alert"`
	// Keys are a Web Push subscription's, as PushSubscription.toJSON()
	// writes them (unpadded base64url): webpush, and unifiedpush from
	// distributors that speak Web Push.
	Keys *pushKeys `json:"keys" msgpack:"keys"`
}

type pushKeys struct {
	P256dh string `json:"p256dh" msgpack:"p256dh"`
	Auth   string `json:"auth" msgpack:"auth"`
}

// vapidKey serves GET /v1/push/vapid: the relay's VAPID public key, for a
// page's pushManager.subscribe({applicationServerKey}). It is public, as
// every push service sees it; 404 when the relay sends no Web Push.
func (s *Server) vapidKey(w http.ResponseWriter, r *http.Request) {
	if s.cfg.VAPIDPublicKey == "" || s.push == nil || !s.push.Enabled(device.PushWebPush) {
		s.writeError(w, r, errorf(http.StatusNotFound, codeNotFound, "This relay sends no Web Push (FN_VAPID_SUBJECT is not set)."))
		return
	}
	writeBody(w, r, http.StatusOK, map[string]string{"public_key": s.cfg.VAPIDPublicKey})
}

// webPushAddress is p's endpoint with its keys, or a 400 naming the field
// that is wrong.
func webPushAddress(p pushRequest) (string, error) {
	if p.Keys == nil {
		return "", badRequest("push.keys is required for kind %s: {\"p256dh\": ..., \"auth\": ...} as PushSubscription.toJSON() gives them.", p.Kind)
	}
	a, err := push.WebPushTarget(p.Endpoint, p.Keys.P256dh, p.Keys.Auth)
	var ke *push.KeyError
	if errors.As(err, &ke) {
		return "", badRequest("push.keys.%s %s.", ke.Field, ke.Reason)
	}
	return a, err
}

type registerRequest struct {
	Push        *pushRequest `json:"push" msgpack:"push"`
	IdentityKey *[]byte      `json:"identity_key" msgpack:"identity_key"`
}

type registerResponse struct {
	Household string `json:"household" msgpack:"household"`
	Device    string `json:"device" msgpack:"device"`
	Cursor    int64  `json:"cursor" msgpack:"cursor"`
	Epoch     string `json:"epoch" msgpack:"epoch"`
}

func (s *Server) register(w http.ResponseWriter, r *http.Request, c *token.Claims) error {
	body, err := wire.ReadBody(w, r, 16<<10)
	if err != nil {
		return err
	}
	var req registerRequest
	if err := wire.DecodeRequest(r, body, &req); err != nil {
		return err
	}
	p := store.RegisterParams{Household: c.Household, Device: c.Device, Now: s.now(), IssuedAt: issuedAt(c)}
	if req.IdentityKey != nil {
		if err := edkey.Check(*req.IdentityKey); err != nil {
			return badRequest("identity_key must be a valid 32-byte Ed25519 public key that is not of small order.")
		}
		p.IdentityKey = *req.IdentityKey
	}
	if req.Push != nil {
		t, err := s.pushTarget(r.Context(), *req.Push)
		if err != nil {
			return err
		}
		p.Push = &t
	}
	ctx, cancel := s.storeCtx(r.Context())
	defer cancel()
	d, err := s.memory.Register(ctx, p)
	if err != nil {
		return err
	}
	writeBody(w, r, http.StatusOK, registerResponse{Household: d.Household, Device: d.Name, Cursor: d.Cursor, Epoch: d.Epoch})
	return nil
}

// pushTarget validates a register request's push target with the push
// queue's own check, the one its workers apply before every push, so that
// nothing is accepted here that would never be pushed. The address field is
// "endpoint" for every kind; "token" is accepted for APNs and FCM.
func (s *Server) pushTarget(ctx context.Context, p pushRequest) (device.PushTarget, error) {
	addr := p.Endpoint
	if addr == "" {
		addr = p.Token
	}
	switch p.Kind {
	case device.PushNone:
		return device.PushTarget{Kind: device.PushNone}, nil
	case device.PushUnifiedPush, device.PushAPNs, device.PushFCM, device.PushWebPush:
	default:
		return device.PushTarget{}, badRequest("push.kind must be one of none, unifiedpush, webpush, apns, fcm.")
	}
	if s.push == nil || !s.push.Enabled(p.Kind) {
		return device.PushTarget{}, badRequest("push.kind %s is not configured on this relay.", p.Kind)
	}
	if p.Kind == device.PushWebPush || (p.Kind == device.PushUnifiedPush && p.Keys != nil) {
		a, err := webPushAddress(p)
		if err != nil {
			return device.PushTarget{}, err
		}
		addr = a
	} else if p.Keys != nil {
		return device.PushTarget{}, badRequest("push.keys is for kinds webpush and unifiedpush only.")
	}
	t := device.PushTarget{Kind: p.Kind, Address: addr}
	if err := s.push.CheckTarget(ctx, t); err != nil {
		msg := map[string]string{
			device.PushUnifiedPush: "push.endpoint must be an http or https URL of printable ASCII without credentials.",
			device.PushWebPush:     "push.endpoint must be an http or https URL of printable ASCII without credentials.",
			device.PushAPNs:        "push.endpoint must be a hex APNs device token.",
			device.PushFCM:         "push.endpoint must be an FCM registration token of printable ASCII.",
		}[p.Kind]
		if errors.Is(err, push.ErrForbiddenAddress) {
			msg = "push.endpoint is not allowed: it must resolve to a public address."
		}
		return device.PushTarget{}, &httpError{Status: http.StatusBadRequest, Code: codeBadRequest, Message: msg, Cause: err}
	}
	if p.Kind == device.PushAPNs {
		t.Address = strings.ToLower(t.Address) // one spelling per device token
		if p.Alert {
			t.Address = push.APNsAlertPrefix + t.Address
		}
	} else if p.Alert {
		return device.PushTarget{}, badRequest("push.alert is for kind apns only.")
	}
	return t, nil
}

type sendRequest struct {
	ID      string   `json:"id" msgpack:"id"`
	To      []string `json:"to" msgpack:"to"`
	Payload []byte   `json:"payload" msgpack:"payload"`
}

type deliveryJSON struct {
	Device string `json:"device" msgpack:"device"`
	Seq    int64  `json:"seq" msgpack:"seq"`
}

type sendResponse struct {
	ID         string         `json:"id" msgpack:"id"`
	Deliveries []deliveryJSON `json:"deliveries" msgpack:"deliveries"`
}

// sendBodyLimit is the largest send body: the payload in base64 plus room
// for the id, every recipient's name and JSON punctuation.
func (s *Server) sendBodyLimit() int64 {
	return int64(base64.StdEncoding.EncodedLen(s.cfg.MaxEnvelopeBytes)) + int64(s.cfg.MaxRecipients)*80 + 4096
}

func (s *Server) send(w http.ResponseWriter, r *http.Request, c *token.Claims) error {
	body, err := wire.ReadBody(w, r, s.sendBodyLimit())
	if err != nil {
		return err
	}
	var req sendRequest
	if err := wire.DecodeRequest(r, body, &req); err != nil {
		return err
	}
	to, err := s.validateSend(&req)
	if err != nil {
		return err
	}
	release, err := s.admit(r.Context(), c.Household)
	if err != nil {
		return err
	}
	defer release()

	p := store.SendParams{
		Household: c.Household, Sender: c.Device, ID: req.ID, To: to, Payload: req.Payload, Now: s.now(),
		MaxPendingEnvelopes: s.cfg.MaxPendingEnvelopes, MaxPendingBytes: s.cfg.MaxPendingBytes,
		MaxHouseholdPendingBytes: s.cfg.MaxHouseholdPending,
	}
	ctx, cancel := s.storeCtx(r.Context())
	defer cancel()
	if s.limits.gates != nil {
		leave, err := s.limits.gates.enter(ctx, c.Household, to, s.cfg.LockTimeout)
		if err != nil {
			return err
		}
		defer leave()
	}
	mark := s.memory.AckMark() // before the send: a batch may land while it runs
	res, err := s.store.Send(ctx, p)
	if errors.Is(err, store.ErrQueueFull) || errors.Is(err, store.ErrHouseholdFull) {
		// The store's pending counts lag the acks this relay has not
		// written yet: write the household's now and try once more.
		if s.memory.FlushHousehold(ctx, c.Household, mark) {
			res, err = s.store.Send(ctx, p)
		}
	}
	if err != nil {
		return err
	}
	if !res.Repeat {
		s.metrics.stored.Add(float64(len(res.Deliveries)))
		// Small envelopes travel with their wakes, so that the relay
		// holding a recipient's poll (this one or another) hands the
		// envelope over without reading back what was just written.
		var env *store.Envelope
		if len(req.Payload) <= memory.WakeEnvelopeMax {
			env = &store.Envelope{ID: req.ID, From: c.Device, SentAt: p.Now.UTC().Truncate(time.Microsecond), Payload: req.Payload}
		}
		s.afterCommit(r.Context(), c.Household, res.Deliveries, env)
	} else {
		// A repeat may follow a first answer lost after its commit (the
		// client could not tell): wake and push again the recipients
		// whose copies still wait, as the first send would have.
		pending := make([]store.Delivery, 0, len(res.Deliveries))
		for _, d := range res.Deliveries {
			if d.Pending {
				pending = append(pending, d)
			}
		}
		s.afterCommit(r.Context(), c.Household, pending, nil)
	}
	out := sendResponse{ID: res.ID, Deliveries: make([]deliveryJSON, len(res.Deliveries))}
	for i, d := range res.Deliveries {
		out.Deliveries[i] = deliveryJSON{Device: d.Device, Seq: d.Seq}
	}
	writeBody(w, r, http.StatusAccepted, out)
	return nil
}

// validateSend checks a send against the protocol and returns its recipients
// sorted and without repeats, the order the store locks them in.
func (s *Server) validateSend(req *sendRequest) ([]string, error) {
	if len(req.ID) < 1 || len(req.ID) > 128 {
		return nil, badRequest("id must be 1 to 128 printable ASCII characters.")
	}
	for i := 0; i < len(req.ID); i++ {
		if req.ID[i] < 0x20 || req.ID[i] > 0x7e {
			return nil, badRequest("id must be 1 to 128 printable ASCII characters.")
		}
	}
	if len(req.Payload) == 0 {
		return nil, badRequest("payload must hold at least one byte.")
	}
	if len(req.Payload) > s.cfg.MaxEnvelopeBytes {
		return nil, errorf(http.StatusRequestEntityTooLarge, codePayloadTooLarge, "payload is larger than %d bytes.", s.cfg.MaxEnvelopeBytes)
	}
	for _, d := range req.To {
		if !device.ValidName(d) {
			return nil, badRequest("Every recipient in to must be 1 to 64 characters of A-Z a-z 0-9 . _ -.")
		}
	}
	to := store.Recipients(req.To)
	if len(to) < 1 || len(to) > s.cfg.MaxRecipients {
		return nil, badRequest("to must name 1 to %d devices.", s.cfg.MaxRecipients)
	}
	return to, nil
}

// afterCommit wakes each recipient's held poll and has the hub push to
// each recipient with a push target and no poll held on any relay. env,
// when not nil, is the envelope (all but its seq), which the wakes carry.
// It runs only after the store committed, and never fails the send: the
// store is the source of truth and a late wake-up only delays a delivery.
func (s *Server) afterCommit(ctx context.Context, household string, ds []store.Delivery, env *store.Envelope) {
	wakes := make([]wake.Wake, len(ds))
	for i, d := range ds {
		wakes[i] = wake.Wake{Key: device.KeyOf(household, d.Device), Life: d.Life, Head: d.Seq}
		if env != nil {
			e := *env
			e.Seq = d.Seq
			wakes[i].Envelope = memory.EncodeEnvelope(e)
		}
	}
	// The hub pushes to each recipient with a push target whose poll no
	// relay holds.
	if s.push != nil {
		for i, d := range ds {
			wakes[i].Push = d.Push
		}
	}
	// The send is committed: its client hanging up now must not stop the
	// wake-up, but a stuck hub must not hold the answer for long either.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if s.hooks.beforeWake != nil {
		s.hooks.beforeWake(wakes)
	}
	s.metrics.signalled.Add(float64(len(wakes)))
	// The idle streams of the recipients held here are delivered to on
	// this goroutine (inline.go), as soon as the hub told this relay's
	// waiters: not after other relays were told.
	idle := s.idleStreams(wakes) // nil, allocating nothing, when none is
	if s.hooks.sendersTook != nil {
		s.hooks.sendersTook()
	}
	if idle != nil {
		sctx = wake.WithLocalDone(sctx, idle.deliver)
	}
	if err := s.hub.Signal(sctx, wakes); err != nil {
		s.metrics.signalErrors.Inc()
		s.log.Debug("wake-up signal failed; held polls fall back to their own timeout", "err", err)
	}
	if idle != nil {
		idle.deliver() // a hub that did not call LocalDone
	}
}

// pushTo queues a push to k, whose poll no relay holds: the hub's Pusher.
func (s *Server) pushTo(k device.Key, t device.PushTarget) {
	if s.push != nil {
		s.push.Enqueue(push.Job{Household: k.Household, Device: k.Device, Target: t})
	}
}

type ackRequest struct {
	Cursor *int64  `json:"cursor" msgpack:"cursor"`
	Epoch  *string `json:"epoch" msgpack:"epoch"`
}

func (s *Server) ack(w http.ResponseWriter, r *http.Request, c *token.Claims) error {
	body, err := wire.ReadBody(w, r, 4<<10)
	if err != nil {
		return err
	}
	var req ackRequest
	if err := wire.DecodeRequest(r, body, &req); err != nil {
		return err
	}
	if req.Cursor == nil || *req.Cursor < 0 {
		return badRequest("cursor must be a whole number from 0 to 2^63-1.")
	}
	epoch := ""
	if req.Epoch != nil {
		if !store.ValidEpoch(*req.Epoch) {
			return errBadEpoch
		}
		epoch = *req.Epoch
	}
	if _, err := s.acknowledge(r.Context(), c, *req.Cursor, epoch); err != nil {
		return err
	}
	writeNoContent(w, r)
	return nil
}

type deviceJSON struct {
	Device       string `json:"device" msgpack:"device"`
	IdentityKey  []byte `json:"identity_key" msgpack:"identity_key"`
	X25519Key    []byte `json:"x25519_key" msgpack:"x25519_key"`
	PushKind     string `json:"push_kind" msgpack:"push_kind"`
	RegisteredAt string `json:"registered_at" msgpack:"registered_at"`
	LastSeen     string `json:"last_seen" msgpack:"last_seen"`
}

type devicesResponse struct {
	Devices []deviceJSON `json:"devices" msgpack:"devices"`
	Next    string       `json:"next,omitempty" msgpack:"next,omitempty"`
}

func (s *Server) devices(w http.ResponseWriter, r *http.Request, c *token.Claims) error {
	q, err := parseQuery(r)
	if err != nil {
		return err
	}
	limit, err := q.int("limit", 100, 1, 1000)
	if err != nil {
		return err
	}
	after := q.get("after")
	if after != "" && !device.ValidName(after) {
		return badRequest("after must be a device name.")
	}
	ctx, cancel := s.storeCtx(r.Context())
	defer cancel()
	ds, err := s.store.Devices(ctx, store.ListParams{Household: c.Household, After: after, Limit: int(limit) + 1})
	if err != nil {
		return err
	}
	out := devicesResponse{Devices: make([]deviceJSON, 0, min(len(ds), int(limit)))}
	if len(ds) > int(limit) {
		ds = ds[:limit]
		out.Next = ds[len(ds)-1].Name
	}
	for _, d := range ds {
		j := deviceJSON{Device: d.Name, RegisteredAt: wire.Timestamp(d.RegisteredAt), LastSeen: wire.Timestamp(d.LastSeen), PushKind: d.Push.Kind}
		if d.Push.Empty() {
			j.PushKind = device.PushNone
		}
		if len(d.IdentityKey) > 0 {
			j.IdentityKey = d.IdentityKey
			j.X25519Key, _ = edkey.Montgomery(d.IdentityKey)
		}
		out.Devices = append(out.Devices, j)
	}
	writeBody(w, r, http.StatusOK, out)
	return nil
}

func (s *Server) deleteDevice(w http.ResponseWriter, r *http.Request, c *token.Claims) error {
	if c.Scope != token.ScopeAdmin {
		return errorf(http.StatusForbidden, codeForbidden, "Only an admin token may remove devices.")
	}
	name := chi.URLParam(r, "device")
	if !device.ValidName(name) {
		return badRequest("The device name is not 1 to 64 characters of A-Z a-z 0-9 . _ -.")
	}
	ctx, cancel := s.storeCtx(r.Context())
	defer cancel()
	// To the microsecond, as the store keeps it, so that what the hub
	// tells other relays equals what their store reads say.
	at := s.now().UTC().Truncate(time.Microsecond)
	if err := s.store.DeleteDevice(ctx, c.Household, name, at); err != nil {
		return err
	}
	// Committed: end the device's held polls on every relay. A failure
	// here delays that only until the polls' next read of the store.
	if err := s.hub.Remove(context.WithoutCancel(ctx), device.KeyOf(c.Household, name), at); err != nil {
		s.log.Warn("telling relays of a removal failed", "err", err)
	}
	writeNoContent(w, r)
	return nil
}

// query reads URL parameters strictly: a parameter given twice is a 400.
type query struct{ v url.Values }

func parseQuery(r *http.Request) (query, error) {
	v, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return query{}, badRequest("The query string is not valid.")
	}
	for k, vs := range v {
		if len(vs) > 1 {
			return query{}, badRequest("Parameter %s is given more than once.", k)
		}
	}
	return query{v}, nil
}

func (q query) get(name string) string { return q.v.Get(name) }

var errBadEpoch = badRequest("epoch must be 1 to 32 characters of A-Z a-z 0-9 _ -.")

// epoch reads the epoch parameter: "" when absent (not checked).
func (q query) epoch() (string, error) {
	raw, ok := q.v["epoch"]
	if !ok {
		return "", nil
	}
	if !store.ValidEpoch(raw[0]) {
		return "", errBadEpoch
	}
	return raw[0], nil
}

// int reads a decimal parameter in [lo, hi]; absent means def.
func (q query) int(name string, def, lo, hi int64) (int64, error) {
	raw, ok := q.v[name]
	if !ok {
		return def, nil
	}
	s := raw[0]
	// Built only when needed: every poll reads three numbers.
	bad := func() error { return badRequest("%s must be a whole number from %d to %d.", name, lo, hi) }
	if s == "" || len(s) > 19 || strings.Trim(s, "0123456789") != "" {
		return 0, bad()
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, bad()
	}
	return n, nil
}
