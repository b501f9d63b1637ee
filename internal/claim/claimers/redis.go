package claimers

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim/redis"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
	"github.com/scheduler-dev/scheduler/internal/config"
)

// redisDriver: one Redis server.
var redisDriver = driver{
	open: func(ctx context.Context, c config.Claimer, instance string, _ Options) (*Backend, error) {
		r := c.Redis
		// ContextTimeoutEnabled: claim calls carry deadlines shorter than
		// the lease, and a hung server must not outlive them.
		// DisableIdentity: a new connection costs no CLIENT SETINFO round
		// trip, which on a slow link could outlast a renewal's trust window.
		client, err := redisClient(&goredis.Options{Addr: r.Addr, ContextTimeoutEnabled: true, DisableIdentity: true},
			r.Username, string(r.Password), r.DB, r.TLS)
		if err != nil {
			return nil, err
		}
		cl, err := redis.Open(ctx, client, redis.Options{Instance: instance, Prefix: r.Prefix,
			DoneTTL: r.DoneTTL.Duration(), AllowEviction: r.AllowEviction})
		if err != nil {
			_ = client.Close()
			return nil, fmt.Errorf("redis %s: %w", r.Addr, err)
		}
		return &Backend{Claimer: cl, Controls: cl.Controls()}, nil
	},
	servers: func(c config.Claimer) []string { return []string{c.Redis.Addr} },
	dial: func(c config.Claimer, addrs []string) (config.Claimer, error) {
		if len(addrs) != 1 {
			return c, fmt.Errorf("redis dials one server, not %d", len(addrs))
		}
		c.Redis.Addr = addrs[0]
		return c, nil
	},
	isolate: func(ctx context.Context, c *config.Claimer, name string) (func(), error) {
		r := &c.Redis
		r.Prefix += name + ":"
		return isolatePrefix(ctx, []string{r.Addr}, r.Prefix, func(addr string) (*goredis.Client, error) {
			return redisClient(&goredis.Options{Addr: addr}, r.Username, string(r.Password), r.DB, r.TLS)
		})
	},
}

// redisClient opens one Redis connection pool; base carries the claimer's
// own settings.
func redisClient(base *goredis.Options, user, password string, db int, t config.TLS) (*goredis.Client, error) {
	tc, err := t.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("redis %s: tls: %w", base.Addr, err)
	}
	base.Username, base.Password, base.DB, base.TLSConfig = user, password, db, tc
	return goredis.NewClient(base), nil
}

// isolatePrefix declares the namespace under prefix new on every server
// that answers (its first claims need not wait out the restart guard of a
// server that just started), and returns what deletes its keys.
func isolatePrefix(ctx context.Context, addrs []string, prefix string, dial func(addr string) (*goredis.Client, error)) (func(), error) {
	for _, addr := range addrs {
		client, err := dial(addr)
		if err != nil {
			return nil, err
		}
		// A node that is down is not an error: its first claims once up
		// wait out the guard.
		_ = redisnode.MarkNew(ctx, client, prefix)
		_ = client.Close()
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		for _, addr := range addrs {
			client, err := dial(addr)
			if err != nil {
				continue
			}
			_ = redisnode.DropPrefix(ctx, client, prefix)
			_ = client.Close()
		}
	}, nil
}
