// Package poolmetrics exports a store's connection pool to Prometheus:
// its size, its use, and the waits for a connection.
package poolmetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flamenet/relay/store"
)

// collector exports the store's connection pool.
type collector struct{ ps store.PoolStatser }

// New returns a collector of ps's pool statistics.
func New(ps store.PoolStatser) prometheus.Collector { return collector{ps} }

var (
	poolMaxDesc      = prometheus.NewDesc("fn_store_pool_max_connections", "Connections the store pool may open.", nil, nil)
	poolOpenDesc     = prometheus.NewDesc("fn_store_pool_open_connections", "Store connections open now.", nil, nil)
	poolInUseDesc    = prometheus.NewDesc("fn_store_pool_in_use_connections", "Store connections busy now.", nil, nil)
	poolWaitsDesc    = prometheus.NewDesc("fn_store_pool_waits_total", "Store connection acquisitions that had to wait.", nil, nil)
	poolWaitSecsDesc = prometheus.NewDesc("fn_store_pool_wait_seconds_total", "Time spent waiting for a store connection.", nil, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolMaxDesc
	ch <- poolOpenDesc
	ch <- poolInUseDesc
	ch <- poolWaitsDesc
	ch <- poolWaitSecsDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.ps.PoolStats()
	ch <- prometheus.MustNewConstMetric(poolMaxDesc, prometheus.GaugeValue, float64(st.Max))
	ch <- prometheus.MustNewConstMetric(poolOpenDesc, prometheus.GaugeValue, float64(st.Open))
	ch <- prometheus.MustNewConstMetric(poolInUseDesc, prometheus.GaugeValue, float64(st.InUse))
	ch <- prometheus.MustNewConstMetric(poolWaitsDesc, prometheus.CounterValue, float64(st.WaitCount))
	ch <- prometheus.MustNewConstMetric(poolWaitSecsDesc, prometheus.CounterValue, st.WaitDuration.Seconds())
}
