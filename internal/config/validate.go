package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"

	"github.com/scheduler-dev/scheduler/internal/schedule"
)

// Error is one configuration problem. Load and Validate return these joined
// with errors.Join; find one with errors.As (main exits 2 on any). Value
// never holds a secret: passwords are masked and DSNs redacted, by the same
// rule as Redacted's.
type Error struct {
	File  string // the file as given to Load; "" for a Config built in code
	Line  int    // 1-based line when known, else 0
	Key   string // dotted key path, e.g. "jobs.billing.nightly.schedule"; "" for the file as a whole
	Value string // the offending value as written; "" when missing or secret
	Msg   string // what is wrong
}

// Error formats as `file: key: "value": msg`; the line is shown instead of
// the key when there is no key.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Key == "" && e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	} else if e.Key == "" && e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
	}
	if e.Value != "" {
		fmt.Fprintf(&b, "%q: ", e.Value)
	}
	b.WriteString(e.Msg)
	return b.String()
}

// problems collects Errors for one file.
type problems struct {
	file string
	errs []error
}

func (p *problems) add(key, value, format string, args ...any) {
	p.at(0, key, value, format, args...)
}

// at records a problem found on line (0 if unknown). value goes through
// redactValue, named by the last element of key, so that no caller can
// show a secret by mistake.
func (p *problems) at(line int, key, value, format string, args ...any) {
	name := key[strings.LastIndexByte(key, '.')+1:]
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Key: key, Value: redactValue(name, value), Msg: fmt.Sprintf(format, args...)})
}

// Validate reports every problem in c at once, joined with errors.Join; each
// is an *Error. registered tells whether a job name has a handler; nil skips
// that check (Load calls Validate(nil); main calls it again with its
// registry). Validate reads the files named by the selected claimer's TLS
// block and parses DSNs, but connects to nothing.
func (c *Config) Validate(registered func(job string) bool) error {
	p := &problems{file: c.file}
	switch {
	case strings.TrimSpace(c.InstanceID) == "":
		p.add("instance_id", "", "missing")
	case strings.ContainsFunc(c.InstanceID, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		// It names the replica in claims, logs, metrics and tables.
		p.add("instance_id", c.InstanceID, "contains a space or a control character")
	case len(c.InstanceID) > 253:
		p.add("instance_id", c.InstanceID[:32]+"…", "longer than 253 bytes (a host name's limit)")
	}
	c.validateClaimer(p)
	c.validateDatabase(p)
	if a := c.HTTP.Addr; a != "" {
		if err := checkAddr(a, true); err != nil {
			p.add("http.addr", a, "%v", err)
		}
	}
	if tok := string(c.HTTP.Token); strings.TrimSpace(tok) != tok {
		// A header's value is trimmed before it is compared: such a token
		// could never match (outside review). The value is not shown.
		p.add("http.token", "", "has leading or trailing whitespace, which no request can present")
	} else if strings.ContainsFunc(tok, unicode.IsControl) {
		// The HTTP server answers 400 to a header holding one, before
		// any handler: the API would be locked, with no error anywhere
		// (outside review).
		p.add("http.token", "", "holds a control character, which no request can present")
	}
	if !oneOf(c.Log.Level, "debug", "info", "warn", "error") {
		p.add("log.level", c.Log.Level, "want debug, info, warn or error")
	}
	if !oneOf(c.Log.Format, "json", "text") {
		p.add("log.format", c.Log.Format, "want json or text")
	}
	nonNegative(p, "shutdown_grace", c.ShutdownGrace)
	for _, name := range c.JobNames() {
		validateJob(p, name, c.Jobs[name], registered)
	}
	return errors.Join(p.errs...)
}

func (c *Config) validateClaimer(p *problems) {
	cl := &c.Claimer
	kind := cl.Kind
	if !oneOf(kind, ClaimerPostgres, ClaimerRedis, ClaimerRedlock, ClaimerEtcd, ClaimerSQLite, ClaimerMemory) {
		p.add("claimer.kind", kind, "unknown kind; want postgres, redis, redlock, etcd, sqlite or memory")
	}
	leaseOK := positive(p, "claimer.lease", cl.Lease)
	if leaseOK && cl.Lease.Duration() < 3*MinRenewEvery {
		p.add("claimer.lease", cl.Lease.String(),
			"must be at least %s: it is renewed every third of it by default, and more often than every %s only loads the backend", 3*MinRenewEvery, MinRenewEvery)
		leaseOK = false
	}
	// Unset, renew_every is derived from the lease (a third): an invalid
	// lease is reported once, not again as the value it left.
	if (leaseOK || cl.RenewEvery != 0) && positive(p, "claimer.renew_every", cl.RenewEvery) && leaseOK {
		switch {
		case cl.RenewEvery >= cl.Lease:
			p.add("claimer.renew_every", cl.RenewEvery.String(),
				"must be shorter than claimer.lease (%s), or the claim expires between renewals", cl.Lease)
		case cl.RenewEvery.Duration() < MinRenewEvery:
			// 1ns passed, and a replica renewed one run's claim 1,270
			// times a second (an outside review).
			p.add("claimer.renew_every", cl.RenewEvery.String(),
				"must be at least %s: renewing more often loads the backend without making the lease any safer", MinRenewEvery)
		}
	}
	if nonNegative(p, "claimer.max_clock_skew", cl.MaxClockSkew) && leaseOK && cl.Lease <= cl.MaxClockSkew {
		p.add("claimer.lease", cl.Lease.String(),
			"must be longer than claimer.max_clock_skew (%s): a lease within the skew bound cannot protect a run", cl.MaxClockSkew)
	}

	pg := cl.Postgres
	switch {
	case pg.DSN == "" && kind == ClaimerPostgres:
		p.add("claimer.postgres.dsn", "", "missing (required when claimer.kind is postgres)")
	case pg.DSN != "" && kind == ClaimerPostgres:
		if err := checkPostgresDSN(pg.DSN); err != nil {
			p.add("claimer.postgres.dsn", pg.DSN, "invalid DSN: %v", err)
		}
	}
	if pg.MaxConns < 0 {
		p.add("claimer.postgres.max_conns", strconv.Itoa(pg.MaxConns), "must not be negative (0 keeps the pool's default)")
	}

	r := cl.Redis
	switch {
	case r.Addr == "" && len(r.Addrs) == 0 && kind == ClaimerRedis && r.Cluster:
		p.add("claimer.redis.addrs", "", "missing (required when claimer.redis.cluster is true: seed nodes of the cluster; addr counts as one)")
	case r.Addr == "" && kind == ClaimerRedis && !r.Cluster:
		p.add("claimer.redis.addr", "", "missing (required when claimer.kind is redis)")
	case r.Addr != "":
		if err := checkAddr(r.Addr, false); err != nil {
			p.add("claimer.redis.addr", r.Addr, "%v", err)
		}
	}
	if len(r.Addrs) > 0 && !r.Cluster {
		p.add("claimer.redis.addrs", strings.Join(r.Addrs, ","),
			"lists the seed nodes of a Redis Cluster: set claimer.redis.cluster: true (one server is claimer.redis.addr; independent servers are claimer.redlock.addrs)")
	}
	seeds := map[string]int{}
	for i, a := range r.Addrs {
		key := fmt.Sprintf("claimer.redis.addrs[%d]", i)
		if err := checkAddr(a, false); err != nil {
			p.add(key, a, "%v", err)
		}
		norm := strings.ToLower(strings.TrimSpace(a))
		if j, dup := seeds[norm]; dup {
			p.add(key, a, "duplicate of addrs[%d]", j)
		}
		seeds[norm] = i
	}
	if r.DB < 0 {
		p.add("claimer.redis.db", strconv.Itoa(r.DB), "must not be negative")
	}
	if r.Cluster && r.DB != 0 {
		p.add("claimer.redis.db", strconv.Itoa(r.DB), "must be 0 with claimer.redis.cluster: a Redis Cluster has database 0 only")
	}
	if r.Cluster && strings.ContainsAny(r.Prefix, "{}") {
		p.add("claimer.redis.prefix", r.Prefix,
			"must not hold a brace with claimer.redis.cluster: the claimer tags every key with its bucket ({n}), and a brace in the prefix would take the hash tag's place")
	}
	if positive(p, "claimer.redis.done_ttl", r.DoneTTL) && kind == ClaimerRedis {
		c.checkDoneTTL(p, "claimer.redis.done_ttl", r.DoneTTL)
	}
	if kind == ClaimerRedis {
		checkTLS(p, "claimer.redis.tls", r.TLS)
	}

	rl := cl.Redlock
	if len(rl.Addrs) == 0 && kind == ClaimerRedlock {
		p.add("claimer.redlock.addrs", "", "missing (required when claimer.kind is redlock)")
	}
	seen := map[string]int{}
	for i, a := range rl.Addrs {
		key := fmt.Sprintf("claimer.redlock.addrs[%d]", i)
		if err := checkAddr(a, false); err != nil {
			p.add(key, a, "%v", err)
		}
		norm := strings.ToLower(strings.TrimSpace(a))
		if j, dup := seen[norm]; dup {
			p.add(key, a, "duplicate of addrs[%d]: one node counted twice fakes a quorum", j)
		}
		seen[norm] = i
	}
	if n := len(rl.Addrs); kind == ClaimerRedlock && n > 0 && !rl.AllowUnsafeNodeCount {
		switch {
		case n < 3:
			p.add("claimer.redlock.addrs", strings.Join(rl.Addrs, ","),
				"%d node(s): a quorum needs at least 3 independent nodes (allow_unsafe_node_count: true for development)", n)
		case n%2 == 0:
			p.add("claimer.redlock.addrs", strings.Join(rl.Addrs, ","),
				"%d nodes tolerate no more failures than %d; use an odd number (or allow_unsafe_node_count: true)", n, n-1)
		}
	}
	if positive(p, "claimer.redlock.done_ttl", rl.DoneTTL) && kind == ClaimerRedlock {
		c.checkDoneTTL(p, "claimer.redlock.done_ttl", rl.DoneTTL)
	}
	if positive(p, "claimer.redlock.node_timeout", rl.NodeTimeout) && kind == ClaimerRedlock && leaseOK && rl.NodeTimeout*10 > cl.Lease {
		p.add("claimer.redlock.node_timeout", rl.NodeTimeout.String(),
			"must be at most a tenth of claimer.lease (%s): waiting on nodes eats into the claim's validity time", cl.Lease)
	}
	if kind == ClaimerRedlock {
		checkTLS(p, "claimer.redlock.tls", rl.TLS)
	}

	c.validateEtcd(p)

	if kind == ClaimerSQLite {
		checkSQLitePath(p, "claimer.sqlite.path", "claimer.kind", cl.SQLite.Path)
	}
	if !oneOf(cl.SQLite.Synchronous, SyncFull, SyncNormal) {
		p.add("claimer.sqlite.synchronous", cl.SQLite.Synchronous, "want full or normal")
	}
}

func (c *Config) validateEtcd(p *problems) {
	e, kind := c.Claimer.Etcd, c.Claimer.Kind
	if len(e.Endpoints) == 0 && kind == ClaimerEtcd {
		p.add("claimer.etcd.endpoints", "", "missing (required when claimer.kind is etcd)")
	}
	seen := map[string]int{}
	for i, a := range e.Endpoints {
		key := fmt.Sprintf("claimer.etcd.endpoints[%d]", i)
		if err := checkAddr(a, false); err != nil {
			p.add(key, a, "%v (TLS is claimer.etcd.tls)", err)
		}
		norm := strings.ToLower(strings.TrimSpace(a))
		if j, dup := seen[norm]; dup {
			p.add(key, a, "duplicate of endpoints[%d]", j)
		}
		seen[norm] = i
	}
	if kind != ClaimerEtcd {
		return
	}
	if e.Username == "" && (e.Password != "" || e.PasswordFile != "") {
		p.add("claimer.etcd.username", "", "missing: a password needs a user name")
	}
	if positive(p, "claimer.etcd.done_ttl", e.DoneTTL) {
		c.checkDoneTTL(p, "claimer.etcd.done_ttl", e.DoneTTL)
	}
	positive(p, "claimer.etcd.dial_timeout", e.DialTimeout)
	if e.Prefix == "" {
		p.add("claimer.etcd.prefix", "", "must not be empty: the claimer would share the cluster's whole key space")
	}
	checkTLS(p, "claimer.etcd.tls", e.TLS)
}

// checkDoneTTL: a done marker must outlive every window in which a replica
// may still claim the run (MinRetention), or the run could execute again.
func (c *Config) checkDoneTTL(p *problems, key string, ttl Duration) {
	if err := c.CheckRetention(ttl.Duration()); err != nil {
		p.add(key, ttl.String(), "%v; once the marker expires the run could execute again", err)
	}
}

func (c *Config) validateDatabase(p *problems) {
	d := c.Database
	switch d.Kind {
	case DatabasePostgres:
		switch {
		case d.DSN == "":
			p.add("database.dsn", "", "missing (required when database.kind is postgres)")
		case c.Claimer.Kind == ClaimerPostgres && d.DSN == c.Claimer.Postgres.DSN:
			// already checked as claimer.postgres.dsn
		default:
			if err := checkPostgresDSN(d.DSN); err != nil {
				p.add("database.dsn", d.DSN, "invalid DSN: %v", err)
			}
		}
		if d.Path != "" {
			p.add("database.path", d.Path, "only used when database.kind is sqlite")
		}
	case DatabaseSQLite:
		if c.Claimer.Kind != ClaimerSQLite || d.Path != c.Claimer.SQLite.Path { // else said once, of the claimer's
			checkSQLitePath(p, "database.path", "database.kind", d.Path)
		}
		if d.DSN != "" {
			p.add("database.dsn", d.DSN, "only used when database.kind is postgres")
		}
	default:
		p.add("database.kind", d.Kind, "unknown kind; want sqlite or postgres")
	}
}

func validateJob(p *problems, name string, j Job, registered func(string) bool) {
	key := "jobs." + name
	if strings.TrimSpace(name) == "" {
		p.add("jobs", "", "empty job name")
		return
	}
	if err := CheckJobName(name); err != nil {
		p.add(key, name, "%v", err)
	}
	if registered != nil && !registered(name) {
		p.add(key, "", "no handler registered under this name")
	}
	switch {
	case j.Timezone == "Local":
		p.add(key+".timezone", j.Timezone, "Local differs between replicas; name an IANA zone such as Europe/Berlin")
	case j.Timezone != "":
		if _, err := schedule.Parse("@daily", j.Timezone); err != nil {
			p.add(key+".timezone", j.Timezone, "unknown time zone; want an IANA name such as Europe/Berlin")
			j.Timezone = "" // still check the spec
		}
	}
	if strings.TrimSpace(j.Schedule) == "" {
		p.add(key+".schedule", "", "missing")
	} else if _, err := schedule.Parse(j.Schedule, j.Timezone); err != nil {
		spec := strings.TrimSpace(j.Schedule)
		msg := strings.TrimPrefix(err.Error(), fmt.Sprintf("schedule %q", spec))
		p.add(key+".schedule", j.Schedule, "%s", strings.TrimLeft(msg, ": "))
	}
	nonNegative(p, key+".timeout", j.Timeout)
	if !oneOf(j.Overlap, OverlapForbid, OverlapAllow, OverlapBufferOne, OverlapReplace) {
		p.add(key+".overlap", j.Overlap, "want forbid, allow, buffer-one or replace")
	}
	if j.MaxAttempts < 1 {
		p.add(key+".max_attempts", strconv.Itoa(j.MaxAttempts), "must be at least 1")
	}
	if !oneOf(j.Misfire.Policy, MisfireSkip, MisfireRunOnce, MisfireRunAll) {
		p.add(key+".misfire.policy", j.Misfire.Policy, "want skip, run-once or run-all")
	}
	nonNegative(p, key+".misfire.grace", j.Misfire.Grace)
	if j.Misfire.MaxCatchup < 1 {
		p.add(key+".misfire.max_catchup", strconv.Itoa(j.Misfire.MaxCatchup), "must be at least 1")
	}
	nonNegative(p, key+".jitter", j.Jitter)
	if j.Retry.Enabled() {
		if j.Retry.MaxAttempts < 1 {
			p.add(key+".retry.max_attempts", strconv.Itoa(j.Retry.MaxAttempts), "must be at least 1")
		}
		if positive(p, key+".retry.backoff", j.Retry.Backoff) && j.Retry.MaxBackoff < j.Retry.Backoff {
			p.add(key+".retry.max_backoff", j.Retry.MaxBackoff.String(), "must be at least retry.backoff (%s)", j.Retry.Backoff)
		}
	} else if j.Retry.MaxAttempts < 0 {
		p.add(key+".retry.max_attempts", strconv.Itoa(j.Retry.MaxAttempts), "must be at least 1")
	}
}

// checkTLS reports the TLS file that cannot be used.
func checkTLS(p *problems, key string, t TLS) {
	if !t.Enabled {
		// A certificate given with TLS left off is a mistake that would
		// connect in the clear without a word (an outside review).
		for _, s := range []struct {
			name string
			set  bool
		}{{"ca_file", t.CAFile != ""}, {"cert_file", t.CertFile != ""}, {"key_file", t.KeyFile != ""},
			{"server_name", t.ServerName != ""}, {"insecure_skip_verify", t.InsecureSkipVerify}} {
			if s.set {
				p.add(key+".enabled", "false", "is false, yet %s.%s is set: connections would go without TLS; set enabled: true, or remove the TLS settings", key, s.name)
				return
			}
		}
	}
	if _, sub, err := t.build(); err != nil {
		file := map[string]string{"ca_file": t.CAFile, "cert_file": t.CertFile, "key_file": t.KeyFile}[sub]
		p.add(key+"."+sub, file, "%v", err)
	}
}

// checkAddr accepts host:port; port 0 (any free port) only if allowZero.
func checkAddr(a string, allowZero bool) error {
	if strings.Contains(a, "://") {
		return errors.New("want host:port, not a URL")
	}
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return errors.New("want host:port")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 || n == 0 && !allowZero {
		return errors.New("want host:port with a port number from 1 to 65535")
	}
	return nil
}

func positive(p *problems, key string, d Duration) bool {
	if d <= 0 {
		p.add(key, d.String(), "must be positive")
		return false
	}
	return true
}

func nonNegative(p *problems, key string, d Duration) bool {
	if d < 0 {
		p.add(key, d.String(), "must not be negative")
		return false
	}
	return true
}

func oneOf(v string, allowed ...string) bool {
	for _, a := range allowed {
		if v == a {
			return true
		}
	}
	return false
}

// checkSQLitePath checks an SQLite database's path, at key, where the
// file system can tell already: a file, or a name to create one under in
// an existing directory. (Opened, SQLite would only say "unable to open
// database file".) What else may refuse the file, a second name or a
// mount of its own, the open checks.
func checkSQLitePath(p *problems, key, kindKey, path string) {
	if path == "" {
		p.add(key, "", "missing (required when %s is sqlite)", kindKey)
		return
	}
	if info, err := os.Stat(path); err == nil {
		what := "not a regular file"
		if info.IsDir() {
			what = "a directory"
		}
		if !info.Mode().IsRegular() {
			p.add(key, path, "%s: want the path of the database file, which is created if missing", what)
		}
		return
	}
	dir := filepath.Dir(path)
	switch info, err := os.Stat(dir); {
	case err != nil:
		p.add(key, path, "the directory %s cannot be used: %v", dir, errors.Unwrap(err))
	case !info.IsDir():
		p.add(key, path, "%s is not a directory", dir)
	}
}

// CheckJobName checks a job's name as the configuration uses it: a
// name with a space or a control character cannot be written as a key
// (package job refuses to register one).
func CheckJobName(name string) error {
	if strings.ContainsFunc(name, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return errors.New("job name must not contain spaces or control characters")
	}
	return nil
}
