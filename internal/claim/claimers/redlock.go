package claimers

import (
	"context"
	"fmt"
	"slices"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim/redlock"
	"github.com/scheduler-dev/scheduler/internal/config"
)

// redlockDriver: a quorum of independent Redis nodes.
var redlockDriver = driver{
	open: func(ctx context.Context, c config.Claimer, instance string, _ Options) (*Backend, error) {
		r := c.Redlock
		var clients []goredis.UniversalClient
		closeAll := func() {
			for _, cc := range clients {
				_ = cc.Close()
			}
		}
		for _, addr := range r.Addrs {
			client, err := redisClient(redlock.ClientOptions(addr), r.Username, credentials(r.Password, r.PasswordFile), 0, r.TLS)
			if err != nil {
				closeAll()
				return nil, err
			}
			clients = append(clients, client)
		}
		cl, err := redlock.New(clients, redlock.Options{Instance: instance, Prefix: r.Prefix,
			DoneTTL: r.DoneTTL.Duration(), NodeTimeout: r.NodeTimeout.Duration(), AllowEviction: r.AllowEviction})
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("redlock: %w", err)
		}
		// As the redis claimer does at start: a node that may evict
		// claims, a wrong password, one server listed twice, or no
		// majority to answer is an error now, not a replica that waits
		// unready for good (found by an outside review).
		if err := cl.Check(ctx); err != nil {
			_ = cl.Close()
			return nil, fmt.Errorf("redlock: %w", err)
		}
		return &Backend{Claimer: cl, Controls: cl.Controls()}, nil
	},
	servers: func(c config.Claimer) []string { return slices.Clone(c.Redlock.Addrs) },
	dial: func(c config.Claimer, addrs []string) (config.Claimer, error) {
		if len(addrs) != len(c.Redlock.Addrs) {
			return c, fmt.Errorf("redlock dials %d nodes, not %d", len(c.Redlock.Addrs), len(addrs))
		}
		c.Redlock.Addrs = slices.Clone(addrs)
		return c, nil
	},
	isolate: func(ctx context.Context, c *config.Claimer, name string) (func() error, error) {
		r := &c.Redlock
		r.Prefix += name + ":"
		return isolatePrefix(ctx, r.Addrs, r.Prefix, func(addr string) (*goredis.Client, error) {
			return redisClient(&goredis.Options{Addr: addr}, r.Username, credentials(r.Password, r.PasswordFile), 0, r.TLS)
		})
	},
}
