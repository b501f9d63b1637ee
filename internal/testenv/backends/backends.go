// Package backends opens every claimer kind against its real test service,
// through the same opener `scheduler run` uses (claimers.Open), for tests
// above the claimer level (runner, explorer, compare, benchmarks) and for
// the claimers' own conformance runs: one isolated namespace per call, one
// client per opened replica.
package backends

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// Kinds lists every claimer kind but etcd. The tests that run every kind
// hold etcd to what its leases cannot give: they are whole seconds, at
// least 1.5 election timeouts (2s on a test cluster), so a retry backoff
// of 200ms lapses to the next attempt only after that. Its own tests
// (internal/claim/etcd) and the real-backend nemesis (internal/explore,
// at twice the time scale) cover it.
var Kinds = slices.DeleteFunc(claimers.Kinds(), func(k string) bool { return k == config.ClaimerEtcd })

// services says where each kind's test service is: servers, when set, are
// the redis server, the redlock nodes or the etcd members to use instead
// of testenv's.
var services = map[string]func(t testing.TB, c *config.Claimer, servers []string){
	config.ClaimerMemory: func(testing.TB, *config.Claimer, []string) {},
	config.ClaimerSQLite: func(t testing.TB, c *config.Claimer, _ []string) {
		// A testenv.FastDir: the tests that use it run leases of hundreds
		// of ms.
		c.SQLite.Path = filepath.Join(testenv.FastDir(t), "claims.db")
	},
	config.ClaimerPostgres: func(t testing.TB, c *config.Claimer, _ []string) {
		c.Postgres.DSN = testenv.PostgresDSN(t)
	},
	config.ClaimerRedis: func(t testing.TB, c *config.Claimer, servers []string) {
		c.Redis.Addr = testenv.RedisAddr(t)
		if len(servers) > 0 {
			c.Redis.Addr = servers[0]
		}
	},
	config.ClaimerEtcd: func(t testing.TB, c *config.Claimer, servers []string) {
		c.Etcd.Endpoints = servers
		if len(servers) == 0 {
			c.Etcd.Endpoints = testenv.EtcdEndpoints(t)
		}
	},
	config.ClaimerRedlock: func(t testing.TB, c *config.Claimer, servers []string) {
		c.Redlock.Addrs = servers
		if len(servers) == 0 {
			c.Redlock.Addrs = testenv.RedlockAddrs(t, 5)
		}
	},
}

// Open prepares an isolated namespace for kind and returns an opener of
// claimers sharing it, each a separate client. Everything is closed and
// dropped when t ends.
func Open(t testing.TB, kind string) func(instance string) *claimers.Backend {
	t.Helper()
	return Prepare(t, kind, Options{}).Open
}

// Factory is Open as a claimtest.Factory: the conformance suite's cases
// each get a fresh namespace prepared with opts.
func Factory(kind string, opts Options) func(t *testing.T) func(instance string) *claimers.Backend {
	return func(t *testing.T) func(instance string) *claimers.Backend {
		t.Helper()
		return Prepare(t, kind, opts).Open
	}
}

// Options adjust Prepare; the zero value is what Open uses.
type Options struct {
	// Servers are the redis server, the redlock nodes or the etcd
	// members to use instead of testenv's (five nodes for redlock, a
	// private 3-member cluster for etcd): a private server a test
	// restarts, say, or nodes many tests share.
	Servers []string
	// Tune, when set, adjusts the claimer's configuration (a done_ttl, a
	// node_timeout) before the namespace is prepared.
	Tune func(c *config.Claimer)
}

// Namespace is one isolated namespace on a kind's service.
type Namespace struct {
	*claimers.Namespace
	t testing.TB
}

// Client shapes one opened claimer's connections.
type Client struct {
	// Via maps a server's address to the one this claimer dials instead
	// (a fault proxy's, say); servers not in it are dialled directly.
	Via map[string]string
	// MaxConns caps a postgres pool (0: pgxpool's default).
	MaxConns int
}

// Open opens a claimer for instance with its own client, closed when the
// Prepare's t ends.
func (n *Namespace) Open(instance string) *claimers.Backend { return n.OpenClient(instance, Client{}) }

// OpenClient is Open with the client shaped by c.
func (n *Namespace) OpenClient(instance string, c Client) *claimers.Backend {
	n.t.Helper()
	b, err := n.Dial(instance, c)
	if err != nil {
		n.t.Fatal(err)
	}
	return b
}

// Dial is OpenClient returning the opener's error (a server that cannot
// be reached, say) instead of failing the test.
func (n *Namespace) Dial(instance string, c Client) (*claimers.Backend, error) {
	ns := n.Namespace
	if c.MaxConns > 0 {
		cp := *ns
		cp.Config.Postgres.MaxConns = c.MaxConns
		ns = &cp
	}
	addrs := ns.Servers()
	for i, a := range addrs {
		if via, ok := c.Via[a]; ok {
			addrs[i] = via
		}
	}
	b, err := ns.OpenVia(context.Background(), instance, addrs)
	if err != nil {
		return nil, err
	}
	n.t.Cleanup(func() { _ = b.Close() })
	return b, nil
}

// Prepare prepares an isolated namespace for kind. Everything it and its
// claimers open is closed and dropped when t ends.
func Prepare(t testing.TB, kind string, opts Options) *Namespace {
	t.Helper()
	find, ok := services[kind]
	if !ok {
		t.Fatalf("unknown claimer kind %q", kind)
	}
	c := config.Default().Claimer
	c.Kind = kind
	find(t, &c, opts.Servers)
	if opts.Tune != nil {
		opts.Tune(&c)
	}
	c.Redis.Prefix, c.Redlock.Prefix, c.Etcd.Prefix = "test:", "test:", "test/"
	var b [8]byte
	_, _ = rand.Read(b[:])
	ns, err := claimers.Isolate(t.Context(), c, "t_"+hex.EncodeToString(b[:]))
	if err != nil {
		testenv.Missing(t, kind, err.Error())
	}
	t.Cleanup(func() { _ = ns.Drop() }) // its server may be gone: a test stopped it
	return &Namespace{Namespace: ns, t: t}
}

// RefuseWrites readies a PostgreSQL namespace whose database is db (a
// claimer's DB, on the namespace's schema) to refuse writes, and returns
// the switch: while it is on, every row written to the run table raises
// disk_full (SQLSTATE 53100), as a server out of space refuses each write
// that needs a page, and statements that write nothing pass, as there.
// An AFTER trigger: it fires for the rows a statement writes and for no
// other (an INSERT … ON CONFLICT DO NOTHING that conflicts, an UPDATE that
// matches none).
func RefuseWrites(ctx context.Context, db *sql.DB) (func(ctx context.Context, on bool) error, error) {
	for _, stmt := range []string{
		`CREATE TABLE refuse_writes (refusing boolean NOT NULL)`,
		`INSERT INTO refuse_writes VALUES (false)`,
		`CREATE FUNCTION refuse_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF (SELECT refusing FROM refuse_writes) THEN
    RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = 'disk_full';
  END IF;
  RETURN NULL;
END $$`,
		`CREATE TRIGGER refuse_write AFTER INSERT OR UPDATE ON scheduler_runs FOR EACH ROW EXECUTE FUNCTION refuse_write()`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return nil, fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return func(ctx context.Context, on bool) error {
		_, err := db.ExecContext(ctx, `UPDATE refuse_writes SET refusing = $1`, on)
		return err
	}, nil
}
