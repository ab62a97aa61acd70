package redis

import (
	"fmt"
	"net/url"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Timeouts NewClient sets when the URL leaves them unset. They are short so
// that nothing waits long on a Redis that is away; Signal has its own,
// shorter bound (Config.PublishTimeout). The subscriber connection reads
// without a deadline: the hub's heartbeat judges whether it is alive.
const (
	clientDialTimeout  = time.Second
	clientReadTimeout  = time.Second
	clientWriteTimeout = time.Second
	clientPoolTimeout  = time.Second
)

// NewClient builds the client for New from a URL. poolSize (when > 0)
// overrides the URL's pool_size: the command pool that publishes, per
// node. Held polls hold no connection; the hub adds one subscriber
// connection (one per master with a Cluster) outside this pool.
//
// URL forms:
//
//	redis://[user:pass@]host[:port][/db][?opts]      one node
//	rediss://...                                      one node over TLS
//	unix://[user:pass@]/path/redis.sock[?db=N&opts]   one node, Unix socket
//	redis://sentinel:26379?master_name=M[&addr=host:port...]
//	                                                  Sentinel: the host and
//	                                                  each addr are sentinels
//	redis://node:6379?cluster=true[&addr=host:port...]
//	                                                  Cluster: the host and
//	                                                  each addr are seed nodes
//
// opts are go-redis's own query parameters (dial_timeout, read_timeout,
// pool_timeout, max_retries, client_name, ...); unknown ones are an error.
// Unset timeouts get short defaults, retries are limited to one, and
// context deadlines are honoured on I/O (ContextTimeoutEnabled), so Signal's
// own deadline bounds it. The client connects lazily; New checks the
// settings against Redis.
func NewClient(rawURL string, poolSize int) (goredis.UniversalClient, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("wake: redis url: %w", err)
	}
	q := u.Query()
	target := rawURL
	cluster := false
	if v := q.Get("cluster"); v != "" {
		if cluster, err = strconv.ParseBool(v); err != nil {
			return nil, fmt.Errorf("wake: redis url: cluster=%q: %w", v, err)
		}
		// go-redis refuses parameters it does not know.
		q.Del("cluster")
		u.RawQuery = q.Encode()
		target = u.String()
	}
	switch {
	case cluster && q.Has("master_name"):
		return nil, fmt.Errorf("wake: redis url: cluster and master_name are exclusive")
	case cluster:
		o, err := goredis.ParseClusterURL(target)
		if err != nil {
			return nil, fmt.Errorf("wake: redis cluster url: %w", err)
		}
		tune(knobs{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout,
			&o.MaxRetries, &o.DialerRetries, &o.PoolSize, &o.ContextTimeoutEnabled}, poolSize)
		return goredis.NewClusterClient(o), nil
	case q.Has("master_name"):
		o, err := goredis.ParseFailoverURL(target)
		if err != nil {
			return nil, fmt.Errorf("wake: redis sentinel url: %w", err)
		}
		tune(knobs{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout,
			&o.MaxRetries, &o.DialerRetries, &o.PoolSize, &o.ContextTimeoutEnabled}, poolSize)
		return goredis.NewFailoverClient(o), nil
	default:
		o, err := goredis.ParseURL(target)
		if err != nil {
			return nil, fmt.Errorf("wake: redis url: %w", err)
		}
		tune(knobs{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout,
			&o.MaxRetries, &o.DialerRetries, &o.PoolSize, &o.ContextTimeoutEnabled}, poolSize)
		return goredis.NewClient(o), nil
	}
}

// knobs points at the same settings in go-redis's three option structs.
type knobs struct {
	dial, read, write, pool *time.Duration
	retries, dialRetries    *int
	poolSize                *int
	ctxTimeout              *bool
}

func tune(k knobs, poolSize int) {
	setDuration(k.dial, clientDialTimeout)
	setDuration(k.read, clientReadTimeout)
	setDuration(k.write, clientWriteTimeout)
	setDuration(k.pool, clientPoolTimeout)
	if *k.retries == 0 {
		*k.retries = 1
	}
	if *k.dialRetries == 0 {
		*k.dialRetries = 1
	}
	if poolSize > 0 {
		*k.poolSize = poolSize
	}
	*k.ctxTimeout = true
}

func setDuration(d *time.Duration, def time.Duration) {
	if *d == 0 {
		*d = def
	}
}
