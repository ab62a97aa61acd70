package relay

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flamenet/relay/store"
)

// countedStore counts the API's calls to the store by operation
// (fn_store_calls_total), so that what a poll or a send costs the store
// can be seen and tested.
type countedStore struct {
	store.Store
	calls *prometheus.CounterVec
}

func (c countedStore) count(op string) { c.calls.WithLabelValues(op).Inc() }

func (c countedStore) Register(ctx context.Context, p store.RegisterParams) (store.Device, error) {
	c.count("register")
	return c.Store.Register(ctx, p)
}

func (c countedStore) Send(ctx context.Context, p store.SendParams) (store.SendResult, error) {
	c.count("send")
	return c.Store.Send(ctx, p)
}

func (c countedStore) Ack(ctx context.Context, p store.AckParams) (store.Position, error) {
	c.count("ack")
	return c.Store.Ack(ctx, p)
}

func (c countedStore) AckMany(ctx context.Context, acks []store.Ack) (store.AckManyResult, error) {
	c.count("ack_many")
	return c.Store.AckMany(ctx, acks)
}

func (c countedStore) State(ctx context.Context, household, device string) (store.DeviceState, error) {
	c.count("state")
	return c.Store.State(ctx, household, device)
}

func (c countedStore) Fetch(ctx context.Context, p store.FetchParams) (store.Batch, error) {
	c.count("fetch")
	return c.Store.Fetch(ctx, p)
}

func (c countedStore) Devices(ctx context.Context, p store.ListParams) ([]store.Device, error) {
	c.count("devices")
	return c.Store.Devices(ctx, p)
}

func (c countedStore) DeleteDevice(ctx context.Context, household, device string, at time.Time) error {
	c.count("delete_device")
	return c.Store.DeleteDevice(ctx, household, device, at)
}

func (c countedStore) RemovedAt(ctx context.Context, household, device string) (time.Time, error) {
	c.count("removed_at")
	return c.Store.RemovedAt(ctx, household, device)
}

func (c countedStore) Removals(ctx context.Context, limit int) ([]store.Removal, error) {
	c.count("removals")
	return c.Store.Removals(ctx, limit)
}

func (c countedStore) ReportHealth(ctx context.Context, r store.RelayHealth, since time.Time) ([]store.RelayHealth, error) {
	c.count("report_health")
	return c.Store.ReportHealth(ctx, r, since)
}

func (c countedStore) Ping(ctx context.Context) error {
	c.count("ping")
	return c.Store.Ping(ctx)
}
