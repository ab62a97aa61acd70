package hostile

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/flamenet/relay/loadtest/internal/wait"
	"github.com/flamenet/relay/loadtest/report"
	"github.com/flamenet/relay/token"
)

// Renewers are devices paired through the relay's own pairing before the
// run, each renewing its credentials every renewEvery throughout it, as a
// household's devices do (much more often, so that a minute holds many):
// beside a flood of guesses at the pairing endpoints, every renewal must
// succeed. Their connections come from the hostile connections' source
// addresses, as a household behind one NAT with a hostile page open would.

const renewEvery = 5 * time.Second

// Renewers are the devices that renew their credentials throughout the
// run.
type Renewers struct {
	n       int
	target  string
	admin   string
	secrets []string
	clients []*http.Client

	mu        sync.Mutex
	attempted int
	succeeded int
	refused   map[string]int // "<status>" or "<status> <limit>", or the error
}

// NewRenewers returns n renewers of the relay at target (its base URL),
// whose household's admin token key mints; tag is the run's.
func NewRenewers(key ed25519.PrivateKey, tag, target string, n int) (*Renewers, error) {
	now := time.Now()
	admin, err := token.Mint(key, token.Claims{Household: "renewers-" + tag, Device: "admin", Scope: token.ScopeAdmin,
		IssuedAt: now, Expires: now.Add(3 * time.Hour)})
	if err != nil {
		return nil, err
	}
	rn := &Renewers{n: n, target: target, admin: admin, refused: map[string]int{}}
	for i := range n {
		d := net.Dialer{Timeout: 5 * time.Second}
		if u := target; len(u) > 17 && u[:17] == "http://127.0.0.1:" {
			d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(128+i%64))}
		}
		rn.clients = append(rn.clients, &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}})
	}
	return rn, nil
}

// Pair invites and pairs every renewer, before the run.
func (rn *Renewers) Pair(ctx context.Context) error {
	rn.secrets = make([]string, rn.n)
	for i := range rn.n {
		device := "renewer-" + strconv.Itoa(i)
		var inv struct{ Code string }
		if err := rn.post(ctx, rn.clients[i], "/v1/invitations", rn.admin, map[string]string{"device": device}, http.StatusCreated, &inv); err != nil {
			return fmt.Errorf("renewers: inviting %s: %w", device, err)
		}
		var c struct {
			RenewalSecret string `json:"renewal_secret"`
		}
		if err := rn.post(ctx, rn.clients[i], "/v1/pair", "", map[string]string{"code": inv.Code}, http.StatusOK, &c); err != nil {
			return fmt.Errorf("renewers: pairing %s: %w", device, err)
		}
		rn.secrets[i] = c.RenewalSecret
	}
	return nil
}

// Run renews every renewer's credentials every renewEvery until end, the
// renewers spread over the first period.
func (rn *Renewers) Run(ctx context.Context, start, end time.Time) {
	var wg sync.WaitGroup
	for i := range rn.n {
		wg.Go(func() {
			next := start.Add(renewEvery * time.Duration(i) / time.Duration(rn.n))
			for {
				if !wait.Until(ctx, next) || next.After(end) {
					return
				}
				rn.renew(ctx, i)
				next = next.Add(renewEvery)
			}
		})
	}
	wg.Wait()
}

func (rn *Renewers) renew(ctx context.Context, i int) {
	var c struct {
		RenewalSecret string `json:"renewal_secret"`
	}
	err := rn.post(ctx, rn.clients[i], "/v1/renew", "", map[string]string{"renewal_secret": rn.secrets[i]}, http.StatusOK, &c)
	rn.mu.Lock()
	defer rn.mu.Unlock()
	rn.attempted++
	if err != nil {
		rn.refused[err.Error()]++
		return
	}
	rn.succeeded++
	rn.secrets[i] = c.RenewalSecret
}

// refusal is an answer other than the one wanted: its status and limit.
type refusal struct {
	status int
	limit  string
}

func (e *refusal) Error() string {
	if e.limit != "" {
		return strconv.Itoa(e.status) + " " + e.limit
	}
	return strconv.Itoa(e.status)
}

func (rn *Renewers) post(ctx context.Context, hc *http.Client, path, tok string, in any, want int, out any) error {
	b, _ := json.Marshal(in)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rn.target+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("no answer")
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != want {
		return &refusal{status: resp.StatusCode, limit: errorLimit(body)}
	}
	return json.Unmarshal(body, out)
}

// Summary returns the report's account of the renewals over the offered
// window, beside the flood against pairing that hostile counted (nil
// without one).
func (rn *Renewers) Summary(window time.Duration, hostile *report.Hostile) *report.Renewals {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	out := &report.Renewals{Renewers: rn.n, EverySeconds: renewEvery.Seconds(), Attempted: rn.attempted, Succeeded: rn.succeeded,
		Refused: rn.refused}
	if hostile != nil && window > 0 {
		n := 0
		for kind, outcomes := range hostile.Outcomes {
			if pairingKind(kind) {
				for _, c := range outcomes {
					n += c
				}
			}
		}
		out.FloodRequests = n
		out.FloodPerSecond = float64(int(float64(n)/window.Seconds()*10)) / 10
	}
	return out
}

// pairingKind says whether a hostile kind is sent to the pairing
// endpoints.
func pairingKind(name string) bool {
	for _, k := range pairingKinds {
		if k.name == name && k.name != "invitation with a device token" {
			return true
		}
	}
	return false
}
