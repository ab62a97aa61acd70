// Package storecalls counts a relay's calls to its store by operation
// (fn_store_calls_total), so that what a poll or a send costs the store
// can be seen and tested.
package storecalls

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

// Count returns st counting each call in calls, under the method's name
// in snake case, before it reaches st.
func Count(st store.Store, calls *prometheus.CounterVec) store.Store {
	return counted{store: st, calls: calls}
}

// counted declares every method of store.Store. The store is a named
// field, not embedded, so that a method added to store.Store fails to
// compile here rather than pass through uncounted
// (TestCountsEveryMethod).
type counted struct {
	store store.Store
	calls *prometheus.CounterVec
}

var _ store.Store = counted{}

func (c counted) count(op string) { c.calls.WithLabelValues(op).Inc() }

// Queue.

func (c counted) Send(ctx context.Context, p store.SendParams) (store.SendResult, error) {
	c.count("send")
	return c.store.Send(ctx, p)
}

func (c counted) Ack(ctx context.Context, p store.AckParams) (store.Position, error) {
	c.count("ack")
	return c.store.Ack(ctx, p)
}

func (c counted) AckMany(ctx context.Context, acks []store.Ack) (store.AckManyResult, error) {
	c.count("ack_many")
	return c.store.AckMany(ctx, acks)
}

func (c counted) State(ctx context.Context, household, device string) (store.DeviceState, error) {
	c.count("state")
	return c.store.State(ctx, household, device)
}

func (c counted) Fetch(ctx context.Context, p store.FetchParams) (store.Batch, error) {
	c.count("fetch")
	return c.store.Fetch(ctx, p)
}

// Directory.

func (c counted) Register(ctx context.Context, p store.RegisterParams) (store.Device, error) {
	c.count("register")
	return c.store.Register(ctx, p)
}

func (c counted) Devices(ctx context.Context, p store.ListParams) ([]store.Device, error) {
	c.count("devices")
	return c.store.Devices(ctx, p)
}

func (c counted) DeleteDevice(ctx context.Context, household, device string, at time.Time) error {
	c.count("delete_device")
	return c.store.DeleteDevice(ctx, household, device, at)
}

func (c counted) RemovedAt(ctx context.Context, household, device string) (time.Time, error) {
	c.count("removed_at")
	return c.store.RemovedAt(ctx, household, device)
}

func (c counted) Removals(ctx context.Context, limit int) ([]store.Removal, error) {
	c.count("removals")
	return c.store.Removals(ctx, limit)
}

func (c counted) ClearPush(ctx context.Context, household, name string, target device.PushTarget) error {
	c.count("clear_push")
	return c.store.ClearPush(ctx, household, name, target)
}

// Pairing.

func (c counted) CreateInvitation(ctx context.Context, p store.InviteParams) error {
	c.count("create_invitation")
	return c.store.CreateInvitation(ctx, p)
}

func (c counted) CancelInvitation(ctx context.Context, household, device string) error {
	c.count("cancel_invitation")
	return c.store.CancelInvitation(ctx, household, device)
}

func (c counted) Invitations(ctx context.Context, p store.InvitationsParams) ([]store.Invitation, error) {
	c.count("invitations")
	return c.store.Invitations(ctx, p)
}

func (c counted) Pair(ctx context.Context, p store.PairParams) (store.Grant, error) {
	c.count("pair")
	return c.store.Pair(ctx, p)
}

func (c counted) Renew(ctx context.Context, p store.RenewParams) (store.Grant, error) {
	c.count("renew")
	return c.store.Renew(ctx, p)
}

// Fleet, Expiry, Probe and Close.

func (c counted) ReportHealth(ctx context.Context, r store.RelayHealth, since time.Time) ([]store.RelayHealth, error) {
	c.count("report_health")
	return c.store.ReportHealth(ctx, r, since)
}

func (c counted) Expire(ctx context.Context, p store.ExpireParams) (store.ExpireResult, error) {
	c.count("expire")
	return c.store.Expire(ctx, p)
}

func (c counted) History(ctx context.Context) (store.History, error) {
	c.count("history")
	return c.store.History(ctx)
}

func (c counted) Ping(ctx context.Context) error {
	c.count("ping")
	return c.store.Ping(ctx)
}

func (c counted) Close() error {
	c.count("close")
	return c.store.Close()
}
