package compare

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/procs"
)

// Claimer kinds compare knows. KindBroken is hidden from the usage text: a
// test double that grants every claim, to prove the harness sees duplicates.
const (
	KindPostgres = config.ClaimerPostgres
	KindRedis    = config.ClaimerRedis
	KindRedlock  = config.ClaimerRedlock
	KindEtcd     = config.ClaimerEtcd
	KindSQLite   = config.ClaimerSQLite
	KindMemory   = config.ClaimerMemory
	KindBroken   = "broken"
)

// Kinds are the claimer kinds a user picks from (KindBroken aside).
var Kinds = []string{KindPostgres, KindRedis, KindRedlock, KindEtcd, KindSQLite, KindMemory}

// redlockNodes is how many redis-server nodes compare starts for redlock
// when --redlock-addrs is not given.
const redlockNodes = 3

// service is where compare finds one kind's backend: the server a flag
// names, or private servers it starts for the cell. Everything else about
// a kind (opening it, isolating a namespace on it, dialling it through a
// proxy) is the opener's, claimers, which `scheduler run` uses too.
type service struct {
	// network: replicas reach the backend over TCP, which network faults
	// act on.
	network bool
	// restart is the fault that crashes one of the kind's private servers.
	restart string
	// shared says why the restart fault cannot run with these options (a
	// flag names a server compare does not own), or "".
	shared func(o *Options) string
	// missing says why the cell cannot run with these options (no server
	// given, none to start), or "". own: the scenario restarts a server.
	missing func(o *Options, own bool) string
	// locate points c at the cell's backend, starting the private servers
	// it needs into ns.
	locate func(ctx context.Context, o *Options, ns *namespace, c *config.Claimer, own bool) error
}

// services holds the kinds that need more than the defaults; memory and
// broken need nothing.
var services = map[string]service{
	KindSQLite: {locate: func(_ context.Context, o *Options, ns *namespace, c *config.Claimer, _ bool) error {
		dir, err := os.MkdirTemp(o.TempDir, "scheduler-compare-*")
		if err != nil {
			return err
		}
		ns.closers = append(ns.closers, func() { _ = os.RemoveAll(dir) })
		c.SQLite.Path = filepath.Join(dir, "claims.db") // the namespace's file goes beside it
		return nil
	}},
	KindPostgres: {network: true, restart: FaultPostgresRestart,
		shared: func(*Options) string { return "" }, // the fault brings its own cluster
		missing: func(o *Options, own bool) string {
			if !own && o.PostgresDSN == "" {
				return "no --postgres-dsn given"
			}
			return ""
		},
		// locate uses --postgres-dsn or, when own, a private cluster
		// compare starts (and a postgres-restart crashes).
		locate: func(ctx context.Context, o *Options, ns *namespace, c *config.Claimer, own bool) error {
			c.Postgres.DSN = o.PostgresDSN
			if !own {
				return nil
			}
			s, err := procs.StartPostgres(ctx, procs.PostgresOptions{Bin: o.PostgresBin, TempDir: o.TempDir})
			if err != nil {
				return privateErr("private PostgreSQL", " (give --postgres-bin)", err)
			}
			ns.own(s)
			c.Postgres.DSN = s.DSN()
			return nil
		}},
	KindRedis: {network: true, restart: FaultRedisRestart,
		shared: func(o *Options) string {
			if o.RedisAddr != "" {
				return "redis-restart needs a redis-server compare starts itself (drop --redis-addr)"
			}
			return ""
		},
		locate: func(ctx context.Context, o *Options, ns *namespace, c *config.Claimer, _ bool) error {
			c.Redis.Prefix = "" // the namespace's name is the prefix
			if o.RedisAddr != "" {
				c.Redis.Addr = o.RedisAddr
				return nil
			}
			addrs, err := ns.redisServers(ctx, o, 1)
			if err == nil {
				c.Redis.Addr = addrs[0]
			}
			return err
		}},
	KindRedlock: {network: true, restart: FaultRedisRestart,
		shared: func(o *Options) string {
			if len(o.RedlockAddrs) > 0 {
				return "redis-restart needs redis-server nodes compare starts itself (drop --redlock-addrs)"
			}
			return ""
		},
		locate: func(ctx context.Context, o *Options, ns *namespace, c *config.Claimer, _ bool) error {
			c.Redlock.Prefix = ""
			if len(o.RedlockAddrs) > 0 {
				c.Redlock.Addrs = o.RedlockAddrs
				return nil
			}
			var err error
			c.Redlock.Addrs, err = ns.redisServers(ctx, o, redlockNodes)
			return err
		}},
	KindEtcd: {network: true,
		// locate uses --etcd-endpoints or a private 3-member cluster
		// (internal/procs) in a fresh directory under --temp-dir.
		locate: func(ctx context.Context, o *Options, ns *namespace, c *config.Claimer, _ bool) error {
			c.Etcd.Prefix = "" // the namespace's name is the prefix
			if len(o.EtcdEndpoints) > 0 {
				c.Etcd.Endpoints = o.EtcdEndpoints
				return nil
			}
			dir, err := os.MkdirTemp(o.TempDir, "scheduler-compare-etcd-*")
			if err != nil {
				return err
			}
			ns.closers = append(ns.closers, func() { _ = os.RemoveAll(dir) })
			e, err := procs.StartEtcd(ctx, procs.EtcdOptions{Dir: dir})
			if err != nil {
				return privateErr("private etcd cluster", " (give --etcd-endpoints)", err)
			}
			ns.closers = append(ns.closers, e.Close)
			c.Etcd.Endpoints = e.Endpoints()
			return nil
		}},
}

// unsupported says why a scenario cannot run on kind, or "".
func unsupported(o *Options, kind string, f faultSet) string {
	s := services[kind]
	if f.network() && !s.network {
		return kind + " has no network link to fault"
	}
	for _, restart := range []string{FaultPostgresRestart, FaultRedisRestart} {
		if !f.has(restart) {
			continue
		}
		if s.restart != restart {
			var to []string
			for _, k := range Kinds {
				if services[k].restart == restart {
					to = append(to, k)
				}
			}
			return restart + " applies to " + strings.Join(to, " and ")
		}
		if why := s.shared(o); why != "" {
			return why
		}
	}
	return ""
}

// missing says why kind's cell cannot run for want of a server, or "".
func missing(o *Options, kind string, f faultSet) string {
	s := services[kind]
	if s.missing == nil {
		return ""
	}
	return s.missing(o, s.restart != "" && f.has(s.restart))
}

// namespace is one cell's isolated slice of a backend (claimers.Isolate:
// a fresh schema, key prefix or file, a memory store) on the servers
// compare was given or started for the cell, removed again by close.
type namespace struct {
	kind string
	ns   *claimers.Namespace // nil for broken
	// targets are the TCP addresses replicas connect to; a network fault
	// puts a proxy in front of each, per replica.
	targets []string
	// servers are the redis-server or PostgreSQL processes compare started
	// for this cell, which a restart fault may crash.
	servers []server
	closers []func()
	// left are what close could not remove from a server the cell did not
	// own (a team's): a schema, a key prefix, named.
	left []error
}

// server is a backend process compare owns (internal/procs).
type server interface {
	Addr() string
	Crash()                          // SIGKILL for redis-server, an immediate shutdown for PostgreSQL
	Start(ctx context.Context) error // again, on the same port and data
	Close()
}

// close stops what the cell started and removes what it created; the
// error names what it could not remove, for the report.
func (n *namespace) close() error {
	for i := len(n.closers) - 1; i >= 0; i-- {
		n.closers[i]()
	}
	return errors.Join(n.left...)
}

// closeInto closes n and notes in res what it left behind.
func (n *namespace) closeInto(res *Cell) {
	if err := n.close(); err != nil {
		res.Notes = append(res.Notes, fmt.Sprintf("cleanup incomplete, remove by hand: %v", err))
	}
}

// own makes s one of the cell's servers, closed with the namespace.
func (n *namespace) own(s server) {
	n.servers = append(n.servers, s)
	n.closers = append(n.closers, s.Close)
}

// open opens one replica's claimer, with a client of its own, through the
// opener `scheduler run` uses (claimers.Open): on the namespace's servers,
// or through addrs (proxies in front of targets, in their order) when set.
func (n *namespace) open(ctx context.Context, instance string, addrs []string) (claim.Claimer, error) {
	if n.ns == nil {
		return &broken{instance: instance}, nil
	}
	if addrs == nil {
		return n.ns.Open(ctx, instance)
	}
	return n.ns.OpenVia(ctx, instance, addrs)
}

// errSkip marks a cell that cannot run here (a backend not configured);
// it is reported as skipped, not failed.
type errSkip struct{ why string }

func (e errSkip) Error() string { return e.why }

// privateErr reports a private server that would not start: skipped when
// its program is not here (hint says how to give it), an error otherwise.
func privateErr(what, hint string, err error) error {
	if procs.IsUnavailable(err) {
		return errSkip{err.Error() + hint}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// openNamespace prepares kind's namespace for a scenario's faults: the
// claimer configuration `scheduler run` would use without a file (same
// defaults: redlock node_timeout, done markers' TTL, pool sizes), pointed
// at the cell's servers, then isolated by claimers.Isolate.
func openNamespace(ctx context.Context, o *Options, kind string, f faultSet) (*namespace, error) {
	ns := &namespace{kind: kind}
	if kind == KindBroken {
		return ns, nil // a test double: no backend
	}
	if why := missing(o, kind, f); why != "" {
		return nil, errSkip{why}
	}
	ok := false
	defer func() {
		if !ok {
			ns.close()
		}
	}()
	c := config.Default().Claimer
	c.Kind = kind
	s := services[kind]
	if s.locate != nil {
		if err := s.locate(ctx, o, ns, &c, s.restart != "" && f.has(s.restart)); err != nil {
			return nil, err
		}
	}
	cns, err := claimers.Isolate(ctx, c, "compare_"+randomHex(6))
	if err != nil {
		return nil, err
	}
	ns.ns, ns.targets = cns, cns.Servers()
	ns.closers = append(ns.closers, func() {
		if err := cns.Drop(); err != nil {
			ns.left = append(ns.left, err)
		}
	})
	ok = true
	return ns, nil
}

// redisServers starts n private redis-server processes for the namespace,
// without persistence.
func (n *namespace) redisServers(ctx context.Context, o *Options, count int) ([]string, error) {
	var addrs []string
	for range count {
		s, err := procs.StartRedis(ctx, procs.RedisOptions{Bin: o.RedisServer})
		if err != nil {
			return nil, privateErr("private redis-server", "", err)
		}
		n.own(s)
		addrs = append(addrs, s.Addr())
	}
	return addrs, nil
}

// isPostgres reports whether s is a private PostgreSQL cluster.
func isPostgres(s server) bool {
	_, ok := s.(*procs.Postgres)
	return ok
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
