package claimers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim/redis"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
	"github.com/scheduler-dev/scheduler/internal/config"
)

// redisDriver: one Redis server, or one Redis Cluster.
var redisDriver = driver{
	open: func(ctx context.Context, c config.Claimer, instance string, _ Options) (*Backend, error) {
		r := c.Redis
		client, err := redisUniversal(r)
		if err != nil {
			return nil, err
		}
		cl, err := redis.Open(ctx, client, redis.Options{Instance: instance, Prefix: r.Prefix,
			DoneTTL: r.DoneTTL.Duration(), AllowEviction: r.AllowEviction})
		if err != nil {
			_ = client.Close()
			return nil, fmt.Errorf("%s: %w", redisName(r), err)
		}
		return &Backend{Claimer: cl, Controls: cl.Controls()}, nil
	},
	servers: func(c config.Claimer) []string { return c.Redis.Seeds() },
	dial: func(c config.Claimer, addrs []string) (config.Claimer, error) {
		seeds := c.Redis.Seeds()
		if len(addrs) != len(seeds) {
			return c, fmt.Errorf("redis dials %d server(s), not %d", len(seeds), len(addrs))
		}
		c.Redis.Addr, c.Redis.Addrs = addrs[0], slices.Clone(addrs[1:])
		return c, nil
	},
	isolate: func(ctx context.Context, c *config.Claimer, name string) (func() error, error) {
		r := &c.Redis
		r.Prefix += name + ":"
		if r.Cluster {
			return isolateCluster(ctx, *r)
		}
		return isolatePrefix(ctx, []string{r.Addr}, r.Prefix, func(addr string) (*goredis.Client, error) {
			return redisClient(&goredis.Options{Addr: addr}, r.Username, credentials(r.Password, r.PasswordFile), r.DB, r.TLS)
		})
	},
}

// redisName names the server or cluster in errors (no password).
func redisName(r config.Redis) string {
	if r.Cluster {
		return "redis cluster " + strings.Join(r.Seeds(), ",")
	}
	return "redis " + r.Addr
}

// redisUniversal opens the claimer's client: a pool to one server, or a
// cluster client that finds every node from the seeds.
func redisUniversal(r config.Redis) (goredis.UniversalClient, error) {
	if !r.Cluster {
		// ContextTimeoutEnabled: claim calls carry deadlines shorter than
		// the lease, and a hung server must not outlive them.
		// DisableIdentity: a new connection costs no CLIENT SETINFO round
		// trip, which on a slow link could outlast a renewal's trust window.
		return redisClient(&goredis.Options{Addr: r.Addr, ContextTimeoutEnabled: true, DisableIdentity: true},
			r.Username, credentials(r.Password, r.PasswordFile), r.DB, r.TLS)
	}
	tc, err := r.TLS.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("%s: tls: %w", redisName(r), err)
	}
	// The same settings, for every node the cluster client opens.
	o := &goredis.ClusterOptions{Addrs: r.Seeds(), Username: r.Username,
		Password: string(r.Password), TLSConfig: tc, ContextTimeoutEnabled: true, DisableIdentity: true}
	if password := credentials(r.Password, r.PasswordFile); password != nil {
		o.CredentialsProvider = func() (string, string) { return r.Username, string(password()) }
	}
	return goredis.NewClusterClient(o), nil
}

// isolateCluster is isolatePrefix on a cluster, through one cluster
// client: every bucket of the namespace is declared new on its master.
func isolateCluster(ctx context.Context, r config.Redis) (func() error, error) {
	client, err := redisUniversal(r)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	// A cluster that is down is not an error: the first claims once up
	// wait out the guard.
	_ = redisnode.MarkNew(ctx, client, r.Prefix)
	return func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		client, err := redisUniversal(r)
		if err == nil {
			err = redisnode.DropPrefix(ctx, client, r.Prefix)
			_ = client.Close()
		}
		if err != nil {
			return fmt.Errorf("redis cluster: keys under %q left: %w", r.Prefix, err)
		}
		return nil
	}, nil
}

// redisClient opens one Redis connection pool; base carries the claimer's
// own settings. password is asked at every new connection (nil: none).
func redisClient(base *goredis.Options, user string, password func() config.Secret, db int, t config.TLS) (*goredis.Client, error) {
	tc, err := t.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("redis %s: tls: %w", base.Addr, err)
	}
	base.Username, base.DB, base.TLSConfig = user, db, tc
	if password != nil {
		base.CredentialsProvider = func() (string, string) { return user, string(password()) }
	}
	return goredis.NewClient(base), nil
}

// credentials is what a client asks for its password at each new
// connection: from password_file, read anew each time (config.Rotating),
// else the password set inline; nil if there is none.
func credentials(inline config.Secret, file string) func() config.Secret {
	switch {
	case file != "":
		return config.Rotating(file, inline)
	case inline != "":
		return func() config.Secret { return inline }
	}
	return nil
}

// isolatePrefix declares the namespace under prefix new on every server
// that answers (its first claims need not wait out the restart guard of a
// server that just started), and returns what deletes its keys.
func isolatePrefix(ctx context.Context, addrs []string, prefix string, dial func(addr string) (*goredis.Client, error)) (func() error, error) {
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
	return func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		var errs []error
		for _, addr := range addrs {
			client, err := dial(addr)
			if err == nil {
				err = redisnode.DropPrefix(ctx, client, prefix)
				_ = client.Close()
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("redis %s: keys under %q left: %w", addr, prefix, err))
			}
		}
		return errors.Join(errs...)
	}, nil
}
