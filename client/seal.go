package client

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/flamenet/relay/seal"
)

// Sealer sends and receives sealed envelopes (package seal, docs/E2E.md)
// as one device: it seals with the device's identity to the keys its
// keyring pinned from the household's directory, and opens with them.
// It is safe for concurrent use.
type Sealer struct {
	c                 *Client
	id                *seal.Identity
	ring              *seal.Keyring
	household, device string

	heldMu sync.Mutex // one read-modify-write of a HeldStore at a time
}

// NewSealer registers id's public key as the device's identity key in the
// directory (with opts, say a push target), learns the device's household
// and name from the answer, and returns the device's Sealer. The keyring
// pins the other devices' keys; reading the directory (Refresh, and
// SendSealed and OpenEnvelope when they need to) reports changed keys
// through it (seal.OnKeyChange); the device's own key it pins at once.
func (c *Client) NewSealer(ctx context.Context, id *seal.Identity, ring *seal.Keyring, opts ...RegisterOption) (*Sealer, error) {
	reg, err := c.Register(ctx, append(opts, WithIdentityKey(id.Public()))...)
	if err != nil {
		return nil, fmt.Errorf("client: registering the identity key: %w", err)
	}
	// The device's own key is the one it holds: a keyring that pinned an
	// earlier identity of this device would report its own new key as a
	// change and refuse what it seals to itself.
	if pin, ok := ring.Pinned(reg.Device); !ok || !bytes.Equal(pin, id.Public()) {
		if err := ring.Trust(ctx, reg.Device, id.Public()); err != nil {
			return nil, err
		}
	}
	return &Sealer{c: c, id: id, ring: ring, household: reg.Household, device: reg.Device}, nil
}

// Household returns the device's household, as the relay named it.
func (s *Sealer) Household() string { return s.household }

// Device returns the device's name, as the relay named it.
func (s *Sealer) Device() string { return s.device }

// Fingerprint returns the device's own fingerprint, for people to compare.
func (s *Sealer) Fingerprint() string { return s.id.Fingerprint() }

// Refresh reads the whole directory into the keyring: keys never seen are
// pinned, keys that differ from their pins are returned (and reported to
// the keyring's OnKeyChange), their pins kept.
func (s *Sealer) Refresh(ctx context.Context) ([]seal.KeyChange, error) {
	dir, err := s.c.Directory(ctx)
	if err != nil {
		return nil, fmt.Errorf("client: reading the directory: %w", err)
	}
	ls := make([]seal.Listing, len(dir))
	for i, d := range dir {
		ls[i] = seal.Listing{Device: d.Device, Key: d.IdentityKey}
	}
	return s.ring.Observe(ctx, ls)
}

// TrustListed pins the key the directory now lists for device, replacing
// its pin: what an app does once its user has compared the new key's
// fingerprint (returned) out of band. A device listed without a key is
// seal.ErrUnknownSender.
func (s *Sealer) TrustListed(ctx context.Context, device string) (ed25519.PublicKey, error) {
	if _, err := s.Refresh(ctx); err != nil {
		return nil, err
	}
	key, _ := s.ring.Listed(device)
	if key == nil {
		return nil, fmt.Errorf("%w: the directory lists no key for %s", seal.ErrUnknownSender, device)
	}
	return key, s.ring.Trust(ctx, device, key)
}

// SendSealed reads the directory (Refresh), seals plaintext to the devices
// in to with their pinned keys, and sends it as Send does, retrying with
// the same id and the same sealed bytes. A recipient without a pinned key
// or without a key in the directory is refused with seal.ErrUnknownSender,
// one whose directory key differs from its pin with seal.ErrKeyChanged:
// nothing is sent then.
func (s *Sealer) SendSealed(ctx context.Context, id string, to []string, plaintext []byte) (SendResult, error) {
	if _, err := s.Refresh(ctx); err != nil {
		return SendResult{}, err
	}
	// The relay collapses repeats; a sealed envelope names each recipient
	// once.
	var devices []string
	seen := map[string]bool{}
	for _, d := range to {
		if !seen[d] {
			seen[d] = true
			devices = append(devices, d)
		}
	}
	rs, err := s.ring.Recipients(devices)
	if err != nil {
		return SendResult{}, fmt.Errorf("client: send %s: %w", id, err)
	}
	sealed, err := seal.Seal(seal.SealParams{Household: s.household, ID: id, Sender: s.device, Identity: s.id, Recipients: rs, Plaintext: plaintext})
	if err != nil {
		return SendResult{}, fmt.Errorf("client: send %s: %w", id, err)
	}
	return s.c.Send(ctx, id, devices, sealed)
}

// OpenEnvelope opens a delivered sealed envelope and returns its
// plaintext. A sender without a pin is looked up in the directory first
// (and pinned, on first use); a sender whose key differs from its pin
// makes it read the directory too, so that the change is reported. Errors
// are the seal package's (errors.Is, seal.Code), or the directory read's.
func (s *Sealer) OpenEnvelope(ctx context.Context, e Envelope) ([]byte, error) {
	p := seal.OpenParams{Household: s.household, Device: s.device, Identity: s.id, ID: e.ID, From: e.From, Sealed: e.Payload}
	pt, err := s.ring.Open(p)
	switch {
	case errors.Is(err, seal.ErrUnknownSender):
		if _, rerr := s.Refresh(ctx); rerr != nil {
			return nil, rerr
		}
		return s.ring.Open(p)
	case errors.Is(err, seal.ErrKeyChanged):
		if _, rerr := s.Refresh(ctx); rerr != nil {
			return nil, rerr
		}
	}
	return pt, err
}

// SealedHandler processes one delivered envelope: its plaintext, or the
// seal error (errors.Is, seal.Code) that kept it from opening. It returns
// nil once done, as a Handler does; an envelope that does not open is
// handed over like any other, and the cursor moves past it when the
// handler returns nil. One refused with seal.ErrKeyChanged is kept in the
// HeldStore first, and handed over again, opened, once the sender's new
// key is trusted (ReopenHeld).
type SealedHandler func(ctx context.Context, e Envelope, plaintext []byte, openErr error) error

// ListenSealed is Listen for sealed envelopes: each is opened
// (OpenEnvelope) before h gets it. An envelope whose sender's key changed
// is saved in held before h gets its error, so that it outlives the
// cursor moving past it; what held keeps from earlier runs is reopened
// first (ReopenHeld). A directory read that fails stops it, with the
// envelope not acknowledged, as a Handler's error does.
func (s *Sealer) ListenSealed(ctx context.Context, cursors CursorStore, held HeldStore, h SealedHandler) error {
	if err := s.ReopenHeld(ctx, held, h); err != nil {
		return err
	}
	return s.c.Listen(ctx, cursors, func(ctx context.Context, e Envelope) error {
		pt, err := s.OpenEnvelope(ctx, e)
		if err != nil && seal.Code(err) == "" {
			return err
		}
		if errors.Is(err, seal.ErrKeyChanged) {
			if herr := s.hold(ctx, held, e); herr != nil {
				return herr
			}
		}
		return h(ctx, e, pt, err)
	})
}

// sameEnvelope: the sender's id names a send; seqs may change after the
// relay's history went back.
func sameEnvelope(a, b Envelope) bool { return a.From == b.From && a.ID == b.ID }

// hold adds e to held, once.
func (s *Sealer) hold(ctx context.Context, held HeldStore, e Envelope) error {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	es, err := held.Load(ctx)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(es, func(x Envelope) bool { return sameEnvelope(x, e) }) {
		return nil
	}
	return held.Save(ctx, append(es, e))
}

// ReopenHeld opens again each envelope held kept back (ListenSealed), as
// an app does after TrustListed: those that open now, or fail for another
// reason than a changed key, are handed to h, in the order they were
// held, and leave held once h returned nil; the others stay. It stops
// with h's error, or when ctx ends (returning nil, as Listen does).
func (s *Sealer) ReopenHeld(ctx context.Context, held HeldStore, h SealedHandler) error {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	es, err := held.Load(ctx)
	if err != nil {
		return err
	}
	for i := 0; i < len(es); {
		if ctx.Err() != nil {
			return nil
		}
		e := es[i]
		pt, err := s.OpenEnvelope(ctx, e)
		switch {
		case errors.Is(err, seal.ErrKeyChanged):
			i++
			continue
		case err != nil && seal.Code(err) == "":
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := h(ctx, e, pt, err); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("client: handler of held envelope %s from %s: %w", e.ID, e.From, err)
		}
		es = slices.Delete(es, i, i+1)
		// Handled: saved even when h ended ctx, as Listen saves the cursor.
		if err := held.Save(context.WithoutCancel(ctx), es); err != nil {
			return err
		}
	}
	return nil
}

// DropHeld discards what held keeps from device (every device when ""),
// as a user who will not trust its new key asks, and says how many went.
func (s *Sealer) DropHeld(ctx context.Context, held HeldStore, device string) (int, error) {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	es, err := held.Load(ctx)
	if err != nil {
		return 0, err
	}
	kept := slices.DeleteFunc(slices.Clone(es), func(e Envelope) bool { return device == "" || e.From == device })
	if len(kept) == len(es) {
		return 0, nil
	}
	return len(es) - len(kept), held.Save(ctx, kept)
}
