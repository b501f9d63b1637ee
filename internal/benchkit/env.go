package benchkit

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/config"
)

// Services says where the real backends are. An empty field leaves out the
// rows that need it.
type Services struct {
	PostgresDSN  string
	RedisAddr    string
	RedlockAddrs []string
	// EtcdEndpoints are the members of one etcd cluster.
	EtcdEndpoints []string
	// Dir holds scratch files (SQLite databases, pgbench logs).
	Dir string
}

// namespace is one isolated namespace of a claimer kind (a fresh schema,
// key prefix, file or store), prepared by claimers.Isolate. open returns a
// separate client each call, as a separate replica would have; close
// closes every client and drops the namespace.
type namespace struct {
	*claimers.Namespace
	name    string // the postgres schema
	s       Services
	closers []func()
}

// isolate prepares a namespace for kind on s's services, configured as
// the benchmark has always run them: finished runs' markers kept 10
// minutes, and redlock's own node timeout (100ms, where the configuration
// defaults to 50ms).
func (s Services) isolate(ctx context.Context, kind string) (*namespace, error) {
	unset := map[string]bool{config.ClaimerPostgres: s.PostgresDSN == "", config.ClaimerRedis: s.RedisAddr == "",
		config.ClaimerRedlock: len(s.RedlockAddrs) == 0, config.ClaimerEtcd: len(s.EtcdEndpoints) == 0}
	if unset[kind] {
		return nil, fmt.Errorf("no %s server", kind)
	}
	c := config.Default().Claimer
	c.Kind = kind
	c.Postgres.DSN, c.Redis.Addr, c.Redlock.Addrs = s.PostgresDSN, s.RedisAddr, s.RedlockAddrs
	c.Etcd.Endpoints = s.EtcdEndpoints
	c.SQLite.Path = filepath.Join(cmp.Or(s.Dir, os.TempDir()), "claims.db") // the namespace's file goes beside it
	c.Redis.Prefix, c.Redlock.Prefix = "", ""                               // the namespace's name is the prefix
	c.Redis.DoneTTL, c.Redlock.DoneTTL = config.Duration(10*time.Minute), config.Duration(10*time.Minute)
	c.Etcd.DoneTTL = config.Duration(10 * time.Minute)
	// A node timeout above scheduler run's default (50ms): the rows and
	// the scale scenario load two cores to the full, and a vote lost to a
	// stalled process is not what they measure.
	c.Redlock.NodeTimeout = config.Duration(100 * time.Millisecond)
	name := "bench_" + randomSuffix()
	ns, err := claimers.Isolate(ctx, c, name)
	if err != nil {
		return nil, err
	}
	return &namespace{Namespace: ns, name: name, s: s}, nil
}

// open opens a claimer for instance on the namespace; close closes it.
func (n *namespace) open(ctx context.Context, instance string) (*claimers.Backend, error) {
	b, err := n.Open(ctx, instance)
	if err != nil {
		return nil, err
	}
	n.closers = append(n.closers, func() { _ = b.Close() })
	return b, nil
}

func (n *namespace) close() {
	for i := len(n.closers) - 1; i >= 0; i-- {
		n.closers[i]()
	}
	n.Drop()
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
