package relay

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/memory"
	"github.com/flamenet/relay/internal/pairing"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/wake"
)

// Pairing's endpoints are package pairing's; here they are tied to the
// server: routed, given its deadlines, and their errors written as every
// other.

var errPairingOff = errorf(http.StatusNotFound, codeNotFound, "No such endpoint.")

func (s *Server) newPairing() *pairing.Pairing {
	c := s.cfg
	return pairing.New(pairing.Config{
		Key: c.IssuerKey, InviteTTL: c.InviteTTL, AccessTokenTTL: c.AccessTokenTTL, RenewalTTL: c.RenewalTTL,
		PublicURL: c.PublicURL, PerAddress: c.PairRatePerAddress, Rate: c.PairRate, TrustedProxies: c.TrustedProxies,
		Origins: c.CORSOrigins,
	}, pairingStore{Pairing: s.store, memory: s.memory, hub: s.hub, log: s.log}, pairingAPI{s}, s.log, s.now)
}

// pairingOn answers 404 before anything else when the relay mints no
// tokens.
func (s *Server) pairingOn(p *pairing.Pairing, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !p.On() {
			s.writeError(w, r, errPairingOff)
			return
		}
		h(w, r)
	}
}

// unauthed runs a handler that takes no token (pair, renew) with a store
// deadline, and writes its error.
func (s *Server) unauthed(h func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		startStoreBudget(r.Context(), s.cfg.StoreTimeout)
		if err := h(w, r); err != nil {
			s.writeError(w, r, err)
		}
	}
}

// pairingAPI is what pairing takes of the server.
type pairingAPI struct{ s *Server }

func (a pairingAPI) Write(w http.ResponseWriter, r *http.Request, status int, v any) {
	writeBody(w, r, status, v)
}

func (a pairingAPI) StoreContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return a.s.storeCtx(ctx)
}

func (a pairingAPI) NoteDevice(ctx context.Context, household, device string) {
	noteDevice(ctx, household, device)
}

// pairingStore pairs through memory, which then knows the new device; a
// pairing that replaced a device ends the old one's held polls on every
// relay, as a removal does.
type pairingStore struct {
	store.Pairing
	memory *memory.Memory
	hub    wake.Hub
	log    *slog.Logger
}

func (p pairingStore) Pair(ctx context.Context, pp store.PairParams) (store.Grant, error) {
	g, err := p.memory.Pair(ctx, pp)
	if err == nil && g.Replaced {
		if err := p.hub.Remove(context.WithoutCancel(ctx), device.KeyOf(g.Household, g.Device), g.RemovedAt); err != nil {
			p.log.Warn("telling relays of a replaced device failed", "err", err)
		}
	}
	return g, err
}
