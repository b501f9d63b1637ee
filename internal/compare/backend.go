package compare

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/config"
)

// Claimer kinds compare knows. KindBroken is hidden from the usage text: a
// test double that grants every claim, to prove the harness sees duplicates.
const (
	KindPostgres = config.ClaimerPostgres
	KindRedis    = config.ClaimerRedis
	KindRedlock  = config.ClaimerRedlock
	KindSQLite   = config.ClaimerSQLite
	KindMemory   = config.ClaimerMemory
	KindBroken   = "broken"
)

// Kinds are the claimer kinds a user picks from (KindBroken aside).
var Kinds = []string{KindPostgres, KindRedis, KindRedlock, KindSQLite, KindMemory}

// redlockNodes is how many redis-server nodes compare starts for redlock
// when --redlock-addrs is not given.
const redlockNodes = 3

// namespace is one cell's isolated slice of a backend: a fresh schema, key
// prefix, set of private servers or file, removed again by close.
type namespace struct {
	// targets are the TCP addresses replicas connect to; a network fault
	// puts a proxy in front of each, per replica.
	targets []string
	// servers are the redis-server or PostgreSQL processes compare started
	// for this cell, which a restart fault may crash.
	servers []server
	// open opens one replica's claimer, its own client, reaching targets[i]
	// through addrs[i].
	open    func(ctx context.Context, instance string, addrs []string) (claim.Claimer, error)
	closers []func()
}

func (n *namespace) close() {
	for i := len(n.closers) - 1; i >= 0; i-- {
		n.closers[i]()
	}
}

// server is a backend process compare owns.
type server interface {
	Addr() string
	crash()                          // SIGKILL for redis-server, an immediate shutdown for PostgreSQL
	start(ctx context.Context) error // again, on the same port (and, for PostgreSQL, data)
	close()
}

// errSkip marks a cell that cannot run here (a backend not configured);
// it is reported as skipped, not failed.
type errSkip struct{ why string }

func (e errSkip) Error() string { return e.why }

// openNamespace prepares kind's namespace for a scenario's faults: a
// restart fault needs a server compare owns.
func openNamespace(ctx context.Context, o *Options, kind string, f faultSet) (*namespace, error) {
	ns := &namespace{}
	ok := false
	defer func() {
		if !ok {
			ns.close()
		}
	}()
	var err error
	switch kind {
	case KindMemory:
		s := memory.NewStore(nil)
		ns.open = func(_ context.Context, id string, _ []string) (claim.Claimer, error) { return memory.New(s, id), nil }
	case KindBroken:
		ns.open = func(_ context.Context, id string, _ []string) (claim.Claimer, error) {
			return &broken{instance: id}, nil
		}
	case KindSQLite:
		err = ns.sqlite(o)
	case KindPostgres:
		err = ns.postgres(ctx, o, f.has(FaultPostgresRestart))
	case KindRedis:
		err = ns.redis(ctx, o)
	case KindRedlock:
		err = ns.redlock(ctx, o)
	default:
		err = fmt.Errorf("unknown claimer %q", kind)
	}
	if err != nil {
		return nil, err
	}
	ok = true
	return ns, nil
}

func (ns *namespace) sqlite(o *Options) error {
	open := o.Open
	dir, err := os.MkdirTemp(o.TempDir, "scheduler-compare-*")
	if err != nil {
		return err
	}
	ns.closers = append(ns.closers, func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "claims.db")
	ns.open = func(ctx context.Context, id string, _ []string) (claim.Claimer, error) {
		cfg := baseConfig(id, KindSQLite)
		cfg.Claimer.SQLite.Path = path
		return open(ctx, cfg)
	}
	return nil
}

// postgres gives the cell a fresh schema on --postgres-dsn or, when own,
// on a private cluster compare starts (and a postgres-restart crashes).
func (ns *namespace) postgres(ctx context.Context, o *Options, own bool) error {
	dsn := o.PostgresDSN
	if own {
		bin, err := o.postgresBin()
		if err != nil {
			return err
		}
		s, err := startPostgres(ctx, bin, o.TempDir)
		if err != nil {
			return fmt.Errorf("private PostgreSQL: %w", err)
		}
		ns.servers = append(ns.servers, s)
		ns.closers = append(ns.closers, s.close)
		dsn = s.DSN()
	}
	if dsn == "" {
		return errSkip{"no --postgres-dsn given"}
	}
	open := o.Open
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("--postgres-dsn: %v", err) // pgx redacts the password
	}
	if !strings.HasPrefix(pc.Host, "/") {
		ns.targets = []string{net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port)))}
	}
	schema := "compare_" + randomHex(6)
	if err := pgExec(ctx, dsn, "CREATE SCHEMA "+schema); err != nil {
		return fmt.Errorf("postgres: create schema: %w", err)
	}
	ns.closers = append(ns.closers, func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = pgExec(ctx, dsn, "DROP SCHEMA "+schema+" CASCADE")
	})
	ns.open = func(ctx context.Context, id string, addrs []string) (claim.Claimer, error) {
		hostport := ""
		if len(addrs) > 0 && addrs[0] != ns.targets[0] {
			hostport = addrs[0]
		}
		replicaDSN, err := schemaDSN(dsn, schema, hostport)
		if err != nil {
			return nil, err
		}
		// Migrate: the first replica applies the migrations to the fresh
		// schema (migrations.Up, under goose's per-schema lock); the others
		// find them applied.
		cfg := baseConfig(id, KindPostgres)
		cfg.Claimer.Postgres.DSN, cfg.Claimer.Postgres.Migrate = replicaDSN, true
		return open(ctx, cfg)
	}
	return nil
}

// baseConfig is the configuration `scheduler run` would use without a
// file (same defaults: redlock node_timeout, done markers' TTL, pool
// sizes), for one replica of kind.
func baseConfig(instance, kind string) *config.Config {
	cfg := config.Default()
	cfg.InstanceID, cfg.Claimer.Kind = instance, kind
	return cfg
}

func pgExec(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// schemaDSN points dsn's connections at schema (search_path) and, when
// hostport is set, at that address instead of the server's.
func schemaDSN(dsn, schema, hostport string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", errors.New("--postgres-dsn: not a valid URL")
		}
		if hostport != "" {
			u.Host = hostport
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	s := dsn + " search_path=" + schema
	if hostport != "" {
		h, p, err := net.SplitHostPort(hostport)
		if err != nil {
			return "", err
		}
		s += " host=" + h + " port=" + p
	}
	return s, nil
}

// redisBin finds redis-server, or says why compare cannot start one.
func (o *Options) redisBin() (string, error) {
	if o.RedisServer != "" {
		return o.RedisServer, nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errSkip{"no redis-server on PATH"}
	}
	return bin, nil
}

// ownServers starts n private redis-server processes for the namespace.
func (ns *namespace) ownServers(ctx context.Context, o *Options, n int) ([]string, error) {
	bin, err := o.redisBin()
	if err != nil {
		return nil, err
	}
	var addrs []string
	for range n {
		s, err := startRedis(ctx, bin)
		if err != nil {
			return nil, err
		}
		ns.servers = append(ns.servers, s)
		ns.closers = append(ns.closers, s.close)
		addrs = append(addrs, s.Addr())
	}
	return addrs, nil
}

func (ns *namespace) redis(ctx context.Context, o *Options) error {
	open := o.Open
	prefix := "compare:" + randomHex(6) + ":"
	var err error
	if o.RedisAddr != "" {
		ns.targets = []string{o.RedisAddr}
		ns.closers = append(ns.closers, func() { dropPrefix(ctx, o.RedisAddr, prefix) })
	} else if ns.targets, err = ns.ownServers(ctx, o, 1); err != nil {
		return err
	}
	ns.open = func(ctx context.Context, id string, addrs []string) (claim.Claimer, error) {
		cfg := baseConfig(id, KindRedis)
		cfg.Claimer.Redis.Addr, cfg.Claimer.Redis.Prefix = addrs[0], prefix
		return open(ctx, cfg)
	}
	return nil
}

func (ns *namespace) redlock(ctx context.Context, o *Options) error {
	open := o.Open
	prefix := "compare:" + randomHex(6) + ":"
	var err error
	if len(o.RedlockAddrs) > 0 {
		ns.targets = o.RedlockAddrs
		ns.closers = append(ns.closers, func() {
			for _, a := range o.RedlockAddrs {
				dropPrefix(ctx, a, prefix)
			}
		})
	} else if ns.targets, err = ns.ownServers(ctx, o, redlockNodes); err != nil {
		return err
	}
	ns.open = func(ctx context.Context, id string, addrs []string) (claim.Claimer, error) {
		cfg := baseConfig(id, KindRedlock)
		cfg.Claimer.Redlock.Addrs, cfg.Claimer.Redlock.Prefix = addrs, prefix
		return open(ctx, cfg)
	}
	return nil
}

// dropPrefix deletes a cell's keys from a Redis server compare does not own.
func dropPrefix(ctx context.Context, addr, prefix string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Del(ctx, iter.Val())
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
