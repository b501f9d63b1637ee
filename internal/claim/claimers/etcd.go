package claimers

import (
	"context"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/etcd"
	"github.com/scheduler-dev/scheduler/internal/config"
)

// etcdDriver: one etcd cluster.
var etcdDriver = driver{
	open: func(ctx context.Context, c config.Claimer, instance string, _ Options) (*Backend, error) {
		e := c.Etcd
		cli, err := etcdClient(e)
		if err != nil {
			return nil, err
		}
		cl := etcd.New(cli, etcd.Options{Instance: instance, Prefix: e.Prefix, DoneTTL: e.DoneTTL.Duration()})
		rctx, cancel := context.WithTimeout(ctx, e.DialTimeout.Duration())
		defer cancel()
		if err := cl.Reach(rctx); err != nil {
			_ = cl.Close()
			hint := ""
			if e.TLS.Enabled {
				hint = " (tls is enabled: do the endpoints serve TLS, under a certificate the CA signed?)"
			}
			return nil, fmt.Errorf("etcd %v: %w%s", e.Endpoints, err, hint)
		}
		return &Backend{Claimer: cl, Controls: cl.Controls()}, nil
	},
	servers: func(c config.Claimer) []string { return slices.Clone(c.Etcd.Endpoints) },
	dial: func(c config.Claimer, addrs []string) (config.Claimer, error) {
		if len(addrs) != len(c.Etcd.Endpoints) {
			return c, fmt.Errorf("etcd dials %d endpoints, not %d", len(c.Etcd.Endpoints), len(addrs))
		}
		c.Etcd.Endpoints = slices.Clone(addrs)
		return c, nil
	},
	isolate: func(ctx context.Context, c *config.Claimer, name string) (func() error, error) {
		e := &c.Etcd
		e.Prefix += name + "/"
		prefix := *e
		return func() error {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			cli, err := etcdClient(prefix)
			if err == nil {
				defer cli.Close()
				_, err = cli.Delete(ctx, prefix.Prefix, clientv3.WithPrefix())
			}
			if err != nil {
				return fmt.Errorf("etcd: keys under %q left: %w", prefix.Prefix, err)
			}
			return nil
		}, nil
	},
}

// etcdClient opens a client of e's cluster. It does not wait for a
// connection (calls wait, within their deadlines), except to
// authenticate when e has a user, within dial_timeout.
func etcdClient(e config.Etcd) (*clientv3.Client, error) {
	tc, err := e.TLS.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcd: tls: %w", err)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   e.Endpoints,
		TLS:         tc,
		Username:    e.Username,
		Password:    string(e.Password),
		DialTimeout: e.DialTimeout.Duration(),
		// Keepalives notice a member that stalls without closing its
		// connections, so that calls move to another. gRPC pings no
		// more often than every 10s (it raises a shorter time to that,
		// and etcd refuses pings more often than 5s), so they notice in
		// 10-12s, longer than a lease: the claimer sends each try of a
		// lease's call again, to the next member, after a share of the
		// lease (internal/claim/etcd/retry.go).
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		// What remains after the TLS check is reaching the cluster to
		// authenticate.
		return nil, fmt.Errorf("etcd %v: %w: %v", e.Endpoints, claim.ErrUnavailable, err)
	}
	return cli, nil
}
