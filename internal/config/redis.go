package config

import (
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// NewRedisClient builds one client for any topology: a single Redis, a
// Sentinel-managed master or a Redis Cluster, from a URL or an address list.
// It returns nil, nil when no Redis is configured.
//
// Every call carries the request's context deadline to the socket
// (ContextTimeoutEnabled), so a stalled Redis cannot hold a request longer
// than the limiter's timeout.
func (r Redis) NewRedisClient() (redis.UniversalClient, error) {
	if !r.Configured() {
		return nil, nil
	}
	if r.URL != "" {
		return r.clientFromURL()
	}
	if r.Mode == "sentinel" && r.MasterName == "" {
		return nil, errors.New("redis: sentinel mode needs a master name")
	}
	opts := &redis.UniversalOptions{
		Addrs:                 r.Addrs,
		Username:              r.Username,
		Password:              r.Password,
		ReadTimeout:           r.Timeout,
		WriteTimeout:          r.Timeout,
		DialTimeout:           dialTimeout(r),
		ContextTimeoutEnabled: true,
		// One dial per attempt: the limiter's breaker and probe decide
		// when to try again, and a connection retried five times in the
		// pool would hold a pipeline worker for half a second.
		DialerRetries: 1,
	}
	switch r.Mode {
	case "sentinel":
		opts.MasterName = r.MasterName
		o := opts.Failover()
		smallPipelineBuffers(&o.PipelineReadBufferSize, &o.PipelineWriteBufferSize)
		return redis.NewFailoverClient(o), nil
	case "cluster":
		return redis.NewClusterClient(opts.Cluster()), nil
	default:
		if len(r.Addrs) != 1 {
			return nil, fmt.Errorf("redis: single mode takes one address, got %d (set --redis-mode=cluster or sentinel)", len(r.Addrs))
		}
		o := opts.Simple()
		smallPipelineBuffers(&o.PipelineReadBufferSize, &o.PipelineWriteBufferSize)
		return redis.NewClient(o), nil
	}
}

// pipelineBuffer is the size of each buffer, read and write, of a
// connection in go-redis's pipeline pool. Its default, 128 KiB, suits
// pipelines of large values; the limiter's carry a batch of short script
// calls and short replies, which a plain connection's 32 KiB holds. At
// 256 KiB a connection, a replica's heap followed how many pipeline
// connections its pool had ever held at once (up to ten): after a Redis
// restart, a burst of round trips dialled more, and the heap stepped up by
// up to 2 MiB for the pool's idle lifetime of 30 minutes.
const pipelineBuffer = 32 << 10

// smallPipelineBuffers sets the pipeline pool's buffers to pipelineBuffer
// unless they are set (a URL's pipeline_read_buffer_size, for one). A
// cluster client has no pipeline pool unless these are set, so it is left
// as it is.
func smallPipelineBuffers(read, write *int) {
	if *read == 0 {
		*read = pipelineBuffer
	}
	if *write == 0 {
		*write = pipelineBuffer
	}
}

func (r Redis) clientFromURL() (redis.UniversalClient, error) {
	switch r.Mode {
	case "cluster":
		o, err := redis.ParseClusterURL(r.URL)
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		r.apply(&o.Username, &o.Password)
		o.ReadTimeout, o.WriteTimeout, o.DialTimeout, o.ContextTimeoutEnabled = r.Timeout, r.Timeout, dialTimeout(r), true
		return redis.NewClusterClient(o), nil
	case "sentinel":
		o, err := redis.ParseFailoverURL(r.URL)
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		if r.MasterName != "" {
			o.MasterName = r.MasterName
		}
		r.apply(&o.Username, &o.Password)
		o.ReadTimeout, o.WriteTimeout, o.DialTimeout, o.ContextTimeoutEnabled = r.Timeout, r.Timeout, dialTimeout(r), true
		smallPipelineBuffers(&o.PipelineReadBufferSize, &o.PipelineWriteBufferSize)
		return redis.NewFailoverClient(o), nil
	default:
		o, err := redis.ParseURL(r.URL)
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		r.apply(&o.Username, &o.Password)
		o.ReadTimeout, o.WriteTimeout, o.DialTimeout, o.ContextTimeoutEnabled = r.Timeout, r.Timeout, dialTimeout(r), true
		smallPipelineBuffers(&o.PipelineReadBufferSize, &o.PipelineWriteBufferSize)
		return redis.NewClient(o), nil
	}
}

func (r Redis) apply(user, pass *string) {
	if r.Username != "" {
		*user = r.Username
	}
	if r.Password != "" {
		*pass = r.Password
	}
}

// dialTimeout gives new connections more room than a call: a TCP handshake
// to a healthy Redis is fast, and a dead one is caught by the call deadline.
func dialTimeout(r Redis) (d time.Duration) {
	d = 10 * r.Timeout
	if d < minDial {
		d = minDial
	}
	return d
}

const minDial = 500 * time.Millisecond
