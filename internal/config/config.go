// Package config holds the scheduler's one configuration tree: the YAML file
// (with ${ENV} expansion), its defaults and its validation. Other packages
// receive the small pieces they need and never read the file or the
// environment themselves.
//
// Load reads, expands, decodes (rejecting unknown keys), reads password
// files, applies defaults and validates. Every problem found is returned at
// once, each as an *Error naming the file, the key and the offending value;
// secrets never appear in error text or in the String/Redacted forms.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Claimer kinds (claimer.kind).
const (
	ClaimerPostgres = "postgres"
	ClaimerRedis    = "redis"
	ClaimerRedlock  = "redlock"
	ClaimerEtcd     = "etcd"
	ClaimerSQLite   = "sqlite"
	ClaimerMemory   = "memory"
)

// Database kinds (database.kind).
const (
	DatabaseSQLite   = "sqlite"
	DatabasePostgres = "postgres"
)

// Overlap policies (jobs.<name>.overlap).
const (
	// OverlapForbid skips a run while the job's previous run still executes.
	OverlapForbid = "forbid"
	// OverlapAllow lets runs of the same job execute concurrently.
	OverlapAllow = "allow"
	// OverlapBufferOne lets one instant wait for the running one and start
	// when it ends; further instants meanwhile are skipped.
	OverlapBufferOne = "buffer-one"
	// OverlapReplace cancels the running run (its handler sees
	// ErrLeaseLost) and starts the new instant once it has stopped.
	OverlapReplace = "replace"
)

// Misfire policies (jobs.<name>.misfire.policy): what start-up does about an
// instant that passed while every replica was down.
const (
	// MisfireSkip records the missed run as missed (claim.Missed).
	MisfireSkip = "skip"
	// MisfireRunOnce executes the latest missed run once, if it is no older
	// than misfire.grace.
	MisfireRunOnce = "run-once"
	// MisfireRunAll executes the latest misfire.max_catchup missed runs
	// no older than misfire.grace, oldest first, one after another, and
	// records the older ones missed.
	MisfireRunAll = "run-all"
)

// Config is the whole configuration file. Build it with Load or Default; a
// Config built in code must set every field itself (defaults are applied only
// by Load) and should pass Validate before use.
type Config struct {
	// InstanceID names this replica in claims and logs. Default: the host name.
	InstanceID string `yaml:"instance_id"`
	// Claimer selects and configures the coordination backend.
	Claimer Claimer `yaml:"claimer"`
	// Database is where job data (invoices, …) lives.
	Database Database `yaml:"database"`
	// HTTP serves /metrics, /healthz, /readyz and the status page.
	HTTP HTTP `yaml:"http"`
	// Log configures the slog handler.
	Log Log `yaml:"log"`
	// ShutdownGrace is how long running handlers may continue after SIGTERM
	// before their claims are released as interrupted. Default 30s.
	ShutdownGrace Duration `yaml:"shutdown_grace"`
	// Jobs maps a job name (e.g. "billing.nightly") to its options. Every
	// name needs a handler registered in code.
	Jobs map[string]Job `yaml:"jobs"`

	file string // as given to Load; prefixes every *Error
}

// MinRenewEvery is the shortest claimer.renew_every.
const MinRenewEvery = 100 * time.Millisecond

// Claimer configures claims: which backend grants them and how long they live.
type Claimer struct {
	// Kind is one of the Claimer* constants. Default sqlite.
	Kind string `yaml:"kind"`
	// Lease is how long a claim lives without renewal. Default 30s.
	Lease Duration `yaml:"lease"`
	// RenewEvery is how often a running claim is renewed. Default Lease/3;
	// at least MinRenewEvery, so Lease is at least three times that.
	RenewEvery Duration `yaml:"renew_every"`
	// MaxClockSkew bounds the clock difference between replicas. Default 2s.
	MaxClockSkew Duration `yaml:"max_clock_skew"`

	Postgres Postgres `yaml:"postgres"` // used when Kind is postgres
	Redis    Redis    `yaml:"redis"`    // used when Kind is redis
	Redlock  Redlock  `yaml:"redlock"`  // used when Kind is redlock
	Etcd     Etcd     `yaml:"etcd"`     // used when Kind is etcd
	SQLite   SQLite   `yaml:"sqlite"`   // used when Kind is sqlite
}

// Postgres configures the postgres claimer.
type Postgres struct {
	// DSN is a pgx connection string (URL or key=value). Required.
	DSN string `yaml:"dsn"`
	// PasswordFile names a file holding the password; its content (minus a
	// trailing newline) is loaded into Password. The DSN must then carry none.
	PasswordFile string `yaml:"password_file"`
	// Password is read from PasswordFile by Load; set it on the pgx config
	// after parsing DSN. Never in YAML.
	Password Secret `yaml:"-"`
	// Migrate applies the goose migrations at start-up. Default true.
	Migrate bool `yaml:"migrate"`
	// MaxConns caps the pool; 0 keeps pgx's default.
	MaxConns int `yaml:"max_conns"`
}

// Redis configures the redis claimer: one server, or one Redis Cluster.
type Redis struct {
	// Addr is host:port. Required, unless Cluster lists Addrs.
	Addr string `yaml:"addr"`
	// Cluster connects to a Redis Cluster: Addr and Addrs are seed nodes
	// (any of its nodes; the client learns the rest), every key carries a
	// hash tag of its job's bucket, and DB must be 0. A single server
	// keeps its key layout.
	Cluster bool `yaml:"cluster"`
	// Addrs are seed nodes of a cluster (host:port), with or beside Addr.
	// Only with Cluster.
	Addrs    []string `yaml:"addrs"`
	Username string   `yaml:"username"`
	// Password for AUTH; or use PasswordFile, not both.
	Password     Secret `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
	// DB is the logical database number.
	DB int `yaml:"db"`
	// Prefix starts every key the claimer writes. Default "scheduler:".
	Prefix string `yaml:"prefix"`
	// DoneTTL is how long a finished run's marker stops late replicas from
	// running it again. Default 48h.
	DoneTTL Duration `yaml:"done_ttl"`
	// AllowEviction accepts a server whose maxmemory-policy may evict claim
	// keys (which would allow a second execution).
	AllowEviction bool `yaml:"allow_eviction"`
	TLS           TLS  `yaml:"tls"`
}

// Seeds are the addresses the redis claimer dials first: Addr, then
// Addrs (for a cluster), without repeats.
func (r Redis) Seeds() []string {
	var out []string
	for _, a := range append([]string{r.Addr}, r.Addrs...) {
		if a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// Redlock configures the redlock claimer: a quorum over independent Redis nodes.
type Redlock struct {
	// Addrs are the nodes' host:port; an odd number, at least 3, unless
	// AllowUnsafeNodeCount.
	Addrs []string `yaml:"addrs"`
	// Username, Password (or PasswordFile) and TLS apply to every node.
	Username     string `yaml:"username"`
	Password     Secret `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
	// Prefix starts every key. Default "scheduler:".
	Prefix string `yaml:"prefix"`
	// DoneTTL is the lifetime of a finished run's marker. Default 48h.
	DoneTTL Duration `yaml:"done_ttl"`
	// NodeTimeout bounds one node's answer. It eats into the claim's validity
	// time, so it must stay far below the lease. Default 50ms.
	NodeTimeout Duration `yaml:"node_timeout"`
	// AllowEviction accepts nodes whose maxmemory-policy may evict claim
	// keys (which would allow a second execution), as for redis.
	AllowEviction bool `yaml:"allow_eviction"`
	TLS           TLS  `yaml:"tls"`
	// AllowUnsafeNodeCount accepts fewer than 3 or an even number of nodes
	// (for development; a quorum then tolerates no failure).
	AllowUnsafeNodeCount bool `yaml:"allow_unsafe_node_count"`
}

// Etcd configures the etcd claimer: one etcd cluster (v3 API).
type Etcd struct {
	// Endpoints are the members' client host:port. Required.
	Endpoints []string `yaml:"endpoints"`
	// Username and Password (or PasswordFile) authenticate to the cluster.
	Username     string `yaml:"username"`
	Password     Secret `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
	// Prefix starts every key. Default "scheduler/".
	Prefix string `yaml:"prefix"`
	// DoneTTL is how long a finished run's record stops late replicas
	// from running it again. Default 48h.
	DoneTTL Duration `yaml:"done_ttl"`
	// DialTimeout bounds the authentication at start-up. Default 5s.
	DialTimeout Duration `yaml:"dial_timeout"`
	TLS         TLS      `yaml:"tls"`
}

// SQLite configures the sqlite claimer.
type SQLite struct {
	// Path of the database file, shared by every process on the host.
	// Default ./scheduler.db.
	Path string `yaml:"path"`
	// Synchronous is SQLite's synchronous setting for the claims: full
	// (the default) syncs the WAL at every commit; normal only at
	// checkpoints, so a commit costs no disk wait, and a power loss or OS
	// crash (not a process crash) can forget the last claims and releases:
	// runs that finished just before it may run again.
	Synchronous string `yaml:"synchronous"`
}

// SQLite synchronous settings.
const (
	SyncFull   = "full"
	SyncNormal = "normal"
)

// TLS configures a client connection to Redis or etcd.
type TLS struct {
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM bundle to verify the server with; empty uses the
	// system roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a client certificate, both or neither.
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify disables certificate verification. Testing only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// Database says where job data lives.
type Database struct {
	// Kind is DatabaseSQLite or DatabasePostgres. Default: postgres with the
	// claimer's DSN when the claimer is postgres, else sqlite at the
	// claimer's sqlite path.
	Kind string `yaml:"kind"`
	// DSN is used when Kind is postgres.
	DSN string `yaml:"dsn"`
	// Path is used when Kind is sqlite.
	Path string `yaml:"path"`
	// Password is copied from claimer.postgres.password_file when DSN is
	// taken from the claimer. Never in YAML.
	Password Secret `yaml:"-"`
}

// HTTP configures the HTTP server.
type HTTP struct {
	// Addr to listen on. Default ":8080"; an explicit "" disables the server.
	Addr string `yaml:"addr"`
	// Token is the bearer token the API's mutating calls (pause, resume,
	// trigger, backfill) require; or use TokenFile, not both. Without
	// one those calls are off and answer 403.
	Token Secret `yaml:"token"`
	// TokenFile names a file holding the token (trailing newline trimmed).
	TokenFile string `yaml:"token_file"`
}

// Log configures logging.
type Log struct {
	// Level is debug, info, warn or error. Default info.
	Level string `yaml:"level"`
	// Format is json or text. Default text.
	Format string `yaml:"format"`
}

// Job holds one job's options.
type Job struct {
	// Schedule is a cron spec: 5 or 6 fields, @daily…, or "@every 90s".
	Schedule string `yaml:"schedule"`
	// Timezone is the IANA zone wall-clock specs fire in. Default UTC.
	Timezone string `yaml:"timezone"`
	// Timeout bounds one run; 0 means none.
	Timeout Duration `yaml:"timeout"`
	// Overlap is OverlapForbid (default) or OverlapAllow.
	Overlap string `yaml:"overlap"`
	// MaxAttempts bounds the grants of one run: its first attempt, the
	// takeovers after crashes and the retries after failures. Default 3.
	MaxAttempts int `yaml:"max_attempts"`
	// Retry retries a run whose handler failed, inside the same run.
	Retry   Retry   `yaml:"retry"`
	Misfire Misfire `yaml:"misfire"`
	// Jitter delays each run by an offset in [0, jitter) hashed from the
	// job and the instant: the same on every replica, and shorter than
	// the gap to the next instant. Default 0.
	Jitter Duration `yaml:"jitter"`
	// Enabled schedules the job. Default true.
	Enabled bool `yaml:"enabled"`
	// Params are decoded into the params type the handler declares
	// (job.Typed), and checked before anything runs; a handler that
	// declares none gets them as they are.
	Params map[string]any `yaml:"params"`
}

// Misfire says what start-up does about instants missed while no replica ran.
type Misfire struct {
	// Policy is MisfireSkip (default) or MisfireRunOnce.
	Policy string `yaml:"policy"`
	// Grace is how old a missed run may be and still run under run-once.
	// Default 1h.
	Grace Duration `yaml:"grace"`
	// MaxCatchup bounds how many missed runs run-all executes. Default 10.
	MaxCatchup int `yaml:"max_catchup"`
}

// Retry is a job's retry policy. A failed or timed-out attempt is retried
// after Backoff, doubled per attempt up to MaxBackoff, by whichever
// replica claims the run next, until max_attempts grants were spent.
type Retry struct {
	// MaxAttempts, when set, replaces the job's max_attempts: it bounds
	// retries and crash takeovers together. 0 or 1 without a backoff:
	// no retries.
	MaxAttempts int `yaml:"max_attempts"`
	// Backoff is the wait before the second attempt. Default 10s once
	// retries are on.
	Backoff Duration `yaml:"backoff"`
	// MaxBackoff caps the doubling. Default 10m.
	MaxBackoff Duration `yaml:"max_backoff"`
}

// Enabled reports whether failed runs retry: the block asks for more than
// one attempt or names a backoff.
func (r Retry) Enabled() bool { return r.MaxAttempts > 1 || r.Backoff > 0 }

// Duration is a time.Duration written as a Go duration string ("30s",
// "1h30m"). A bare number other than 0 is an error: "30" has no unit.
type Duration time.Duration

// Duration returns d as a time.Duration.
func (d Duration) Duration() time.Duration { return time.Duration(d) }

// String formats d like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return errors.New(`want a duration such as "30s"`)
	}
	v, err := time.ParseDuration(strings.TrimSpace(n.Value))
	if err != nil {
		if strings.Trim(n.Value, "0123456789.+-") == "" {
			return errors.New(`a bare number has no unit; write e.g. "30s"`)
		}
		return errors.New(`want a Go duration such as "30s" or "1h30m"`)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes d as a duration string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// mask replaces every secret in String, YAML and logs.
const mask = "xxxxx"

// Secret is a string that formats as "xxxxx" (or "" when empty) everywhere:
// fmt, slog and YAML. Use string(s) where the real value is needed.
type Secret string

// String hides the secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return mask
}

// GoString hides the secret from %#v.
func (s Secret) GoString() string { return fmt.Sprintf("%q", s.String()) }

// LogValue hides the secret from slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalYAML hides the secret from Redacted.
func (s Secret) MarshalYAML() (any, error) { return s.String(), nil }

// String shows the block with the DSN's password replaced.
func (p Postgres) String() string {
	p.DSN = Redact(p.DSN)
	return fmt.Sprintf("%+v", postgresNoString(p))
}

type postgresNoString Postgres

// String shows the block with the DSN's password replaced.
func (d Database) String() string {
	d.DSN = Redact(d.DSN)
	return fmt.Sprintf("%+v", databaseNoString(d))
}

type databaseNoString Database

// String is Redacted, so that printing a Config cannot leak a secret.
func (c Config) String() string { return c.Redacted() }

// Redacted renders the configuration as YAML with every password replaced
// by "xxxxx" and DSNs redacted. A param is hidden whole when its name holds
// password, secret, token, credential or key (but does not end in _file);
// other params are shown with any DSN password masked.
func (c Config) Redacted() string {
	c.Claimer.Postgres.DSN = Redact(c.Claimer.Postgres.DSN)
	c.Database.DSN = Redact(c.Database.DSN)
	if c.Jobs != nil {
		jobs := make(map[string]Job, len(c.Jobs))
		for name, j := range c.Jobs {
			j.Params, _ = redactParam("", j.Params).(map[string]any)
			jobs[name] = j
		}
		c.Jobs = jobs
	}
	out, err := yaml.Marshal(&c)
	if err != nil {
		return "config: " + err.Error()
	}
	return string(out)
}

// JobNames returns the configured job names, sorted.
func (c *Config) JobNames() []string {
	names := make([]string, 0, len(c.Jobs))
	for name := range c.Jobs {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
