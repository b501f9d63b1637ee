package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// secret is planted in every bad config; no error text may contain it.
const secret = "s3cr3t-pw"

// write stores content as config.yaml in a fresh directory.
func write(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func load(t *testing.T, content string) (*Config, string, error) {
	t.Helper()
	path := write(t, content)
	c, err := Load(path)
	return c, path, err
}

func mustLoad(t *testing.T, content string) *Config {
	t.Helper()
	c, _, err := load(t, content)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return c
}

// splitErrors splits a joined error into its *Errors.
func splitErrors(t *testing.T, err error) []*Error {
	t.Helper()
	var out []*Error
	for _, e := range unjoin(err) {
		var ce *Error
		if !errors.As(e, &ce) {
			t.Fatalf("not a *config.Error: %T %v", e, e)
		}
		out = append(out, ce)
	}
	return out
}

func TestLoadRejectsBadConfig(t *testing.T) {
	// pg and rd carry the secret; every case includes one of them.
	pg := "  postgres:\n    dsn: postgres://app:" + secret + "@db:5432/app\n"
	rd := "  redis:\n    addr: localhost:6379\n    password: " + secret + "\n"
	job := func(body string) string { return "jobs:\n  billing.nightly:\n" + body }
	tests := []struct {
		name, yaml, key, value, msg string
	}{
		{"UnknownTopLevelKey", "colour: blue\nclaimer:\n" + pg, "colour", "", "unknown key"},
		{"UnknownNestedKey", "claimer:\n  kind: redis\n" + rd + "    adr: x:1\n", "claimer.redis.adr", "", "unknown key"},
		{"CronFieldOutOfRange", "claimer:\n" + rd + job("    schedule: \"61 * * * *\"\n"), "jobs.billing.nightly.schedule", "61 * * * *", "above maximum (59)"},
		{"CronGarbage", "claimer:\n" + rd + job("    schedule: every tuesday\n"), "jobs.billing.nightly.schedule", "every tuesday", ""},
		{"UnknownTimeZone", "claimer:\n" + rd + job("    schedule: '@daily'\n    timezone: Mars/Olympus\n"), "jobs.billing.nightly.timezone", "Mars/Olympus", "unknown time zone"},
		{"LocalTimeZone", "claimer:\n" + rd + job("    schedule: '@daily'\n    timezone: Local\n"), "jobs.billing.nightly.timezone", "Local", "differs between replicas"},
		{"UnknownClaimerKind", "claimer:\n  kind: zookeeper\n" + pg, "claimer.kind", "zookeeper", "want postgres, redis"},
		{"InstanceIDWithASpace", "instance_id: \"a b\"\nclaimer:\n" + pg, "instance_id", "a b", "contains a space or a control character"},
		{"InstanceIDWithALineBreak", "instance_id: \"a\\nb\"\nclaimer:\n" + pg, "instance_id", "a\nb", "contains a space or a control character"},
		{"PostgresWithoutDSN", "claimer:\n  kind: postgres\n" + rd, "claimer.postgres.dsn", "", "missing"},
		{"InvalidURLDSN", "claimer:\n  kind: postgres\n  postgres:\n    dsn: postgres://app:" + secret + "@db:port/app\n", "claimer.postgres.dsn", "postgres://app:xxxxx@db:port/app", "invalid DSN"},
		{"PasswordWithAnUnencodedAt", "claimer:\n  kind: postgres\n  postgres:\n    dsn: postgres://app:ab@" + secret + "@db:5432/app\n", "claimer.postgres.dsn", "postgres://app:xxxxx@db:5432/app", "not percent-encoded"},
		{"DatabasePasswordWithAnUnencodedAt", "claimer:\n" + pg + "database:\n  kind: postgres\n  dsn: postgresql://app:ab@" + secret + "@db/app?sslmode=disable\n", "database.dsn", "postgresql://app:xxxxx@db/app?sslmode=disable", "write '@' as %40"},
		{"InvalidPoolSetting", "claimer:\n  kind: postgres\n  postgres:\n    dsn: postgres://app:" + secret + "@db:5432/app?pool_max_conns=abc\n", "claimer.postgres.dsn", "postgres://app:xxxxx@db:5432/app?pool_max_conns=abc", "pool_max_conns"},
		{"InvalidKeyValueDSN", "claimer:\n  kind: postgres\n  postgres:\n    dsn: host=db password=" + secret + " port=abc\n", "claimer.postgres.dsn", "host=db password=xxxxx port=abc", "invalid DSN"},
		{"RedisWithoutAddr", "claimer:\n  kind: redis\n  redis:\n    password: " + secret + "\n", "claimer.redis.addr", "", "missing"},
		{"RedisAddrIsURL", "claimer:\n  kind: redis\n  redis:\n    addr: redis://:" + secret + "@h:6379\n", "claimer.redis.addr", "redis://:xxxxx@h:6379", "not a URL"},
		{"RedlockTwoNodes", "claimer:\n  kind: redlock\n  redlock:\n    password: " + secret + "\n    addrs: [a:1, b:1]\n", "claimer.redlock.addrs", "a:1,b:1", "at least 3"},
		{"RedlockEvenNodes", "claimer:\n  kind: redlock\n  redlock:\n    password: " + secret + "\n    addrs: [a:1, b:1, c:1, d:1]\n", "claimer.redlock.addrs", "a:1,b:1,c:1,d:1", "odd number"},
		{"RedlockDuplicateNode", "claimer:\n  kind: redlock\n  redlock:\n    password: " + secret + "\n    addrs: [a:1, b:1, a:1]\n", "claimer.redlock.addrs[2]", "a:1", "duplicate"},
		{"RedlockNodeTimeoutNearLease", "claimer:\n  kind: redlock\n  redlock:\n    password: " + secret + "\n    addrs: [a:1, b:1, c:1]\n    node_timeout: 5s\n", "claimer.redlock.node_timeout", "5s", "tenth of claimer.lease"},
		{"SQLitePathIsADirectory", "claimer:\n  kind: sqlite\n  sqlite:\n    path: " + os.TempDir() + "\n" + rd, "claimer.sqlite.path", os.TempDir(), "a directory: want the path of the database file"},
		{"SQLitePathInAMissingDirectory", "claimer:\n  kind: sqlite\n  sqlite:\n    path: /nonexistent/claims.db\n" + rd, "claimer.sqlite.path", "/nonexistent/claims.db", "the directory /nonexistent cannot be used: no such file"},
		{"DatabasePathIsADirectory", "claimer:\n" + pg + "database:\n  kind: sqlite\n  path: " + os.TempDir() + "\n", "database.path", os.TempDir(), "a directory"},
		{"SQLiteSynchronousOff", "claimer:\n  kind: sqlite\n  sqlite:\n    synchronous: \"off\"\n" + rd, "claimer.sqlite.synchronous", "off", "want full or normal"},
		{"NegativeLease", "claimer:\n  lease: -5s\n" + pg, "claimer.lease", "-5s", "must be positive"},
		{"RenewNotBelowLease", "claimer:\n  lease: 10s\n  renew_every: 10s\n" + pg, "claimer.renew_every", "10s", "shorter than claimer.lease"},
		{"RenewEveryBelowItsFloor", "claimer:\n  lease: 30s\n  renew_every: 1ns\n" + pg, "claimer.renew_every", "1ns", "at least 100ms"},
		{"LeaseBelowItsFloor", "claimer:\n  lease: 150ms\n  max_clock_skew: 0s\n" + pg, "claimer.lease", "150ms", "at least 300ms"},
		{"LeaseWithinSkew", "claimer:\n  lease: 2s\n  renew_every: 500ms\n  max_clock_skew: 3s\n" + pg, "claimer.lease", "2s", "longer than claimer.max_clock_skew"},
		{"BareNumberDuration", "claimer:\n  lease: 30\n" + pg, "claimer.lease", "30", "no unit"},
		{"BadDurationString", "claimer:\n" + pg + "shutdown_grace: thirty\n", "shutdown_grace", "thirty", "Go duration"},
		{"NegativeShutdownGrace", "claimer:\n" + pg + "shutdown_grace: -1s\n", "shutdown_grace", "-1s", "negative"},
		{"UnknownOverlap", "claimer:\n" + rd + job("    schedule: '@daily'\n    overlap: sometimes\n"), "jobs.billing.nightly.overlap", "sometimes", "want forbid, allow, buffer-one or replace"},
		{"UnknownMisfirePolicy", "claimer:\n" + rd + job("    schedule: '@daily'\n    misfire: {policy: later}\n"), "jobs.billing.nightly.misfire.policy", "later", "want skip, run-once or run-all"},
		{"RetryMaxBackoffBelowBackoff", "claimer:\n" + rd + job("    schedule: '@daily'\n    retry: {backoff: 1m, max_backoff: 10s}\n"), "jobs.billing.nightly.retry.max_backoff", "10s", "at least retry.backoff"},
		{"RetryConflictsWithMaxAttempts", "claimer:\n" + rd + job("    schedule: '@daily'\n    max_attempts: 2\n    retry: {max_attempts: 5}\n"), "jobs.billing.nightly.retry.max_attempts", "5", "set one"},
		{"NegativeJitter", "claimer:\n" + rd + job("    schedule: '@daily'\n    jitter: -5m\n"), "jobs.billing.nightly.jitter", "-5m0s", "negative"},
		{"ZeroMaxCatchup", "claimer:\n" + rd + job("    schedule: '@daily'\n    misfire: {policy: run-all, max_catchup: 0}\n"), "jobs.billing.nightly.misfire.max_catchup", "0", "at least 1"},
		{"ZeroMaxAttempts", "claimer:\n" + rd + job("    schedule: '@daily'\n    max_attempts: 0\n"), "jobs.billing.nightly.max_attempts", "0", "at least 1"},
		{"MaxAttemptsNotANumber", "claimer:\n" + rd + job("    schedule: '@daily'\n    max_attempts: many\n"), "jobs.billing.nightly.max_attempts", "many", "want an integer"},
		{"NegativeTimeout", "claimer:\n" + rd + job("    schedule: '@daily'\n    timeout: -1m\n"), "jobs.billing.nightly.timeout", "-1m0s", "negative"},
		{"EmptyJobName", "claimer:\n" + rd + "jobs:\n  \"\":\n    schedule: '@daily'\n", "jobs", "", "empty job name"},
		{"BadLogLevel", "claimer:\n" + pg + "log:\n  level: verbose\n", "log.level", "verbose", "want debug, info, warn or error"},
		{"BadLogFormat", "claimer:\n" + pg + "log:\n  format: xml\n", "log.format", "xml", "want json or text"},
		{"BadHTTPAddr", "claimer:\n" + pg + "http:\n  addr: localhost\n", "http.addr", "localhost", "host:port"},
		{"DatabaseSQLiteWithDSN", "claimer:\n" + pg + "database:\n  kind: sqlite\n  dsn: postgres://u:" + secret + "@h/db\n", "database.dsn", "postgres://u:xxxxx@h/db", "only used when database.kind is postgres"},
		{"UnknownDatabaseKind", "claimer:\n" + pg + "database:\n  kind: mysql\n", "database.kind", "mysql", "want sqlite or postgres"},
		{"PasswordAndPasswordFile", "claimer:\n  kind: redis\n" + rd + "    password_file: /run/secrets/redis\n", "claimer.redis.password_file", "", "keep one"},
		{"PasswordFileMissing", "claimer:\n  kind: redis\n  redis:\n    addr: h:1\n    password_file: /nonexistent/pw\n", "claimer.redis.password_file", "/nonexistent/pw", "no such file"},
		{"TokenAndTokenFile", "claimer:\n" + pg + "http:\n  token: " + secret + "\n  token_file: /run/secrets/api\n", "http.token_file", "", "keep one"},
		{"TokenWithSpaces", "claimer:\n" + pg + "http:\n  token: \" " + secret + " \"\n", "http.token", "", "leading or trailing whitespace"},
		{"TokenWithAControlCharacter", "claimer:\n" + pg + "http:\n  token: \"" + secret + "\\x07\"\n", "http.token", "", "control character"},
		{"TokenFileMissing", "claimer:\n" + pg + "http:\n  token_file: /nonexistent/token\n", "http.token_file", "/nonexistent/token", "no such file"},
		{"SecretOfWrongType", "claimer:\n  redis:\n    password: [" + secret + "]\n", "claimer.redis.password", "", "want a string"},
		{"DoneTTLShorterThanGrace", "claimer:\n  kind: redis\n" + rd + "    done_ttl: 2h\n" + job("    schedule: '@daily'\n    misfire: {policy: run-once, grace: 6h}\n"), "claimer.redis.done_ttl", "2h0m0s", "misfire.grace"},
		{"DoneTTLWithinSkipJobsWindow", "claimer:\n  kind: redis\n" + rd + "    done_ttl: 1h\n" + job("    schedule: '@daily'\n"), "claimer.redis.done_ttl", "1h0m0s", "at least 1h1m4s, the longest a replica may still claim a finished run of jobs.billing.nightly"},
		{"RedlockDoneTTLEqualToGrace", "claimer:\n  kind: redlock\n  redlock:\n    password: " + secret + "\n    addrs: [a:1, b:1, c:1]\n    done_ttl: 6h\n" + job("    schedule: '@daily'\n    misfire: {policy: run-once, grace: 6h}\n"), "claimer.redlock.done_ttl", "6h0m0s", "at least 6h1m4s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, path, err := load(t, tt.yaml)
			if err == nil {
				t.Fatal("Load succeeded")
			}
			text := err.Error()
			if strings.Contains(text, secret) {
				t.Errorf("error leaks the secret:\n%s", text)
			}
			var found *Error
			for _, p := range splitErrors(t, err) {
				if p.Key == tt.key {
					found = p
					break
				}
			}
			if found == nil {
				t.Fatalf("no problem for key %q in:\n%s", tt.key, text)
			}
			line := found.Error()
			want := path + ": " + tt.key + ": "
			if tt.value != "" {
				want += fmt.Sprintf("%q: ", tt.value)
			}
			if !strings.HasPrefix(line, want) || !strings.Contains(line, tt.msg) {
				t.Errorf("got  %s\nwant %s…%s", line, want, tt.msg)
			}
		})
	}
}

func TestLoadLocatesTypeErrors(t *testing.T) {
	// Each problem is located from its YAML node: the key path, and the line
	// of the value as written (the anchor's, for a value merged in).
	_, path, err := load(t, `claimer:
  kind: redis
  redis:
    addr: h:1
    db: many
jobs:
  base: &base
    schedule: "@daily"
    enabled: maybe
  copy:
    <<: *base
    misfire:
      grace: [1h]
    overlap: forbid
    overlap: allow
`)
	got := splitErrors(t, err)
	want := []Error{
		{File: path, Line: 5, Key: "claimer.redis.db", Value: "many", Msg: "want an integer"},
		{File: path, Line: 9, Key: "jobs.base.enabled", Value: "maybe", Msg: "want true or false"},
		{File: path, Line: 13, Key: "jobs.copy.misfire.grace", Msg: `want a duration such as "30s"`},
		{File: path, Line: 15, Key: "jobs.copy.overlap", Msg: "defined twice (first at line 14)"},
		{File: path, Line: 9, Key: "jobs.copy.enabled", Value: "maybe", Msg: "want true or false"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%v", len(got), len(want), err)
	}
	for i := range want {
		if *got[i] != want[i] {
			t.Errorf("problem %d:\ngot  %+v\nwant %+v", i, *got[i], want[i])
		}
	}
}

func TestLoadReportsEveryProblemAtOnce(t *testing.T) {
	_, _, err := load(t, `
claimer:
  kind: zookeeper
log:
  level: loud
jobs:
  a:
    schedule: "61 * * * *"
`)
	got := splitErrors(t, err)
	if len(got) != 3 {
		t.Fatalf("got %d problems, want 3:\n%v", len(got), err)
	}
	for i, key := range []string{"claimer.kind", "log.level", "jobs.a.schedule"} {
		if got[i].Key != key {
			t.Errorf("problem %d is %q, want %q", i, got[i].Key, key)
		}
	}
}

func TestLoadExpandsEnvironment(t *testing.T) {
	t.Setenv("CFG_TEST_ID", "replica-7")
	t.Setenv("CFG_TEST_EMPTY", "")
	c := mustLoad(t, `
instance_id: ${CFG_TEST_ID}  # ${CFG_TEST_UNSET_IN_COMMENT} is not expanded
# dsn: ${CFG_TEST_UNSET_COMMENTED_OUT}
claimer:
  kind: redis
  redis:
    addr: ${CFG_TEST_UNSET_ADDR:-localhost:6379}
    password: "pa$$w$rd$HOME$${LITERAL}$"
    username: ${CFG_TEST_EMPTY:-fallback}
    prefix: "${CFG_TEST_EMPTY}x:"
`)
	r := c.Claimer.Redis
	for _, tt := range []struct{ name, got, want string }{
		{"Plain", c.InstanceID, "replica-7"},
		{"DefaultWhenUnset", r.Addr, "localhost:6379"},
		{"DollarsUntouched", string(r.Password), "pa$$w$rd$HOME${LITERAL}$"},
		{"DefaultWhenEmpty", r.Username, "fallback"},
		{"EmptyWithoutDefault", r.Prefix, "x:"},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, tt.got, tt.want)
		}
	}
}

func TestLoadReportsUnsetVariables(t *testing.T) {
	_, path, err := load(t, "instance_id: a\nclaimer:\n  postgres:\n    dsn: ${CFG_TEST_UNSET_DSN}\nhttp:\n  addr: ${CFG_TEST_UNSET_ADDR}\nlog: {level: '${bad name}'}\n")
	got := splitErrors(t, err)
	if len(got) != 3 {
		t.Fatalf("got %d problems, want 3:\n%v", len(got), err)
	}
	for i, want := range []string{
		path + ":4: ${CFG_TEST_UNSET_DSN}: environment variable CFG_TEST_UNSET_DSN is not set",
		path + ":6: ${CFG_TEST_UNSET_ADDR}: environment variable CFG_TEST_UNSET_ADDR is not set",
		path + ":7: malformed ${…}",
	} {
		if !strings.HasPrefix(got[i].Error(), want) {
			t.Errorf("got  %s\nwant %s…", got[i], want)
		}
	}
}

// A value put in by ${…} that YAML would not read as set (cut short as
// a comment, or ending its quotes) is an error naming the reference and
// its line, never showing the value; the same value where YAML reads it
// as written loads.
func TestLoadRefusesAValueYAMLWouldMisread(t *testing.T) {
	for _, tt := range []struct{ name, value, line, want string }{
		{"CommentInPlainScalar", secret + " #x", "    dsn: postgres://u:${CFG_TEST_PW}@db/app", "start of a comment"},
		{"LeadingHashAfterBlank", "#" + secret, "    dsn: ${CFG_TEST_PW}", "start of a comment"},
		{"QuoteInDoubleQuotes", secret + `"x`, `    dsn: "postgres://u:${CFG_TEST_PW}@db/app"`, "end of the quoted value"},
		{"BackslashInDoubleQuotes", secret + `\x`, `    dsn: "postgres://u:${CFG_TEST_PW}@db/app"`, "escape"},
		{"QuoteInSingleQuotes", secret + "'x", "    dsn: 'postgres://u:${CFG_TEST_PW}@db/app'", "in a file instead"},
		{"LineBreak", secret + "\nx", "    dsn: 'postgres://u:${CFG_TEST_PW}@db/app'", "a line break"},
		{"LeadingAnchor", "&" + secret + " x", "    dsn: ${CFG_TEST_PW}", "a leading '&'"},
		{"LeadingQuote", `"` + secret + `"`, "    dsn: ${CFG_TEST_PW}", "a leading '\"'"},
		{"LeadingFlowInAList", "[" + secret, "    dsn: [${CFG_TEST_PW}]", "a leading '['"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("CFG_TEST_PW", tt.value)
			_, path, err := load(t, "claimer:\n  kind: postgres\n  postgres:\n"+tt.line+"\n")
			if err == nil {
				t.Fatal("Load succeeded")
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error leaks the value:\n%s", err)
			}
			if want := path + ":4: ${CFG_TEST_PW}: the value holds"; !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got  %s\nwant %s…%s", err, want, tt.want)
			}
		})
	}
	for _, tt := range []struct{ name, value, line string }{
		{"HashWithoutABlank", secret + "#x", "    password: ab${CFG_TEST_PW}"},
		{"CommentInSingleQuotes", secret + " #x", "    password: 'ab${CFG_TEST_PW}'"},
		{"CommentInDoubleQuotes", secret + " #x", `    password: "ab${CFG_TEST_PW}"`},
		{"QuoteInPlainScalar", secret + `"x`, "    password: ab${CFG_TEST_PW}"},
		{"AnchorMidValue", "&" + secret, "    password: ab ${CFG_TEST_PW}"},
		{"AnchorAfterAColonWithoutABlank", "&" + secret, "    password: a:${CFG_TEST_PW}"},
		{"AnchorInSingleQuotes", "&" + secret, "    password: '${CFG_TEST_PW}'"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("CFG_TEST_PW", tt.value)
			c := mustLoad(t, "claimer:\n  kind: redis\n  redis:\n    addr: h:6379\n"+tt.line+"\n")
			if got, want := string(c.Claimer.Redis.Password), strings.NewReplacer("    password: ", "", "'", "", `"`, "", "${CFG_TEST_PW}", tt.value).Replace(tt.line); got != want {
				t.Errorf("password %q, want %q", got, want)
			}
		})
	}
}

// A block scalar's lines are text to YAML: a value there that starts
// with '{' or holds " #" or a quote is read as written, and a '#' in the
// block does not stop the references after it from being expanded. A
// line break still is an error: the value's next line would leave the
// block.
func TestLoadExpandsBlockScalarsAsText(t *testing.T) {
	t.Setenv("CFG_TEST_JSON", `{"a": "b #c", 'd': 1}`)
	t.Setenv("CFG_TEST_ID", "r-1")
	c := mustLoad(t, `
claimer:
  kind: redis
  redis:
    addr: h:6379
jobs:
  a:
    schedule: "@daily"
    params:
      body: |
        ${CFG_TEST_JSON}
        # not a comment: ${CFG_TEST_ID}

      list:
        - >-
          "${CFG_TEST_ID}"
instance_id: ${CFG_TEST_ID}
`)
	p := c.Jobs["a"].Params
	if got, want := p["body"], `{"a": "b #c", 'd': 1}`+"\n# not a comment: r-1\n"; got != want {
		t.Errorf("body %q, want %q", got, want)
	}
	if got, ok := p["list"].([]any); !ok || len(got) != 1 || got[0] != `"r-1"` {
		t.Errorf("list %#v, want the folded block's text", p["list"])
	}
	if c.InstanceID != "r-1" {
		t.Errorf("instance_id %q after the block, want r-1", c.InstanceID)
	}
	t.Setenv("CFG_TEST_JSON", "a\nb")
	_, path, err := load(t, "jobs:\n  a:\n    schedule: \"@daily\"\n    params:\n      body: |\n        ${CFG_TEST_JSON}\n")
	if want := path + ":6: ${CFG_TEST_JSON}: the value holds a line break"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("a line break in a block: %v, want %s…", err, want)
	}
}

// An '@' after the host, in the query, is not the password's.
func TestAnAtInTheQueryIsNotThePasswords(t *testing.T) {
	c := mustLoad(t, "claimer:\n  kind: postgres\n  postgres:\n    dsn: postgres://u:pw@db:5432/app?application_name=a@b\n")
	if c.Claimer.Postgres.DSN != "postgres://u:pw@db:5432/app?application_name=a@b" {
		t.Errorf("dsn %q", c.Claimer.Postgres.DSN)
	}
}

func TestLoadReadsPasswordFiles(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pw")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("Redis", func(t *testing.T) {
		c := mustLoad(t, "claimer:\n  kind: redis\n  redis:\n    addr: h:6379\n    password_file: "+file+"\n")
		if got := string(c.Claimer.Redis.Password); got != secret {
			t.Errorf("password %q, want %q", got, secret)
		}
	})
	t.Run("HTTPToken", func(t *testing.T) {
		c := mustLoad(t, "http:\n  token_file: "+file+"\n")
		if got := string(c.HTTP.Token); got != secret {
			t.Errorf("token %q, want %q", got, secret)
		}
	})
	t.Run("PostgresAlsoFeedsDatabase", func(t *testing.T) {
		c := mustLoad(t, "claimer:\n  kind: postgres\n  postgres:\n    dsn: postgres://app@db/app\n    password_file: "+file+"\n")
		if got := string(c.Claimer.Postgres.Password); got != secret {
			t.Errorf("claimer password %q, want %q", got, secret)
		}
		if c.Database.Kind != DatabasePostgres || c.Database.DSN != "postgres://app@db/app" || string(c.Database.Password) != secret {
			t.Errorf("database %+v, want the claimer's DSN and password", c.Database)
		}
	})
	t.Run("PostgresDSNWithPassword", func(t *testing.T) {
		_, _, err := load(t, "claimer:\n  kind: postgres\n  postgres:\n    dsn: postgres://app:"+secret+"@db/app\n    password_file: "+file+"\n")
		if err == nil || !strings.Contains(err.Error(), "claimer.postgres.password_file: set both") || strings.Contains(err.Error(), secret) {
			t.Errorf("got %v", err)
		}
	})
	t.Run("OtherKindNotRead", func(t *testing.T) {
		c := mustLoad(t, "claimer:\n  kind: sqlite\n  redis:\n    password_file: /nonexistent\n")
		if c.Claimer.Redis.Password != "" {
			t.Error("read the password file of an unselected claimer")
		}
	})
}

func TestLoadAppliesDefaults(t *testing.T) {
	hostname = func() (string, error) { return "host-1", nil }
	t.Cleanup(func() { hostname = os.Hostname })
	c := mustLoad(t, `
claimer:
  lease: 45s
jobs:
  a:
    schedule: "@hourly"
  b:
    schedule: "@hourly"
    enabled: false
    max_attempts: 1
    misfire: {grace: 0s}
  r:
    schedule: "@hourly"
    retry: {max_attempts: 5}
  s:
    schedule: "@hourly"
    retry: {backoff: 20m}
`)
	a, b, rj, sj := c.Jobs["a"], c.Jobs["b"], c.Jobs["r"], c.Jobs["s"]
	for _, tt := range []struct {
		name string
		got  any
		want any
	}{
		{"InstanceID", c.InstanceID, "host-1"},
		{"Kind", c.Claimer.Kind, ClaimerSQLite},
		{"RenewEvery", c.Claimer.RenewEvery.Duration(), 15 * time.Second},
		{"MaxClockSkew", c.Claimer.MaxClockSkew.Duration(), 2 * time.Second},
		{"PostgresMigrate", c.Claimer.Postgres.Migrate, true},
		{"RedisPrefix", c.Claimer.Redis.Prefix, "scheduler:"},
		{"RedisDoneTTL", c.Claimer.Redis.DoneTTL.Duration(), 48 * time.Hour},
		{"RedlockNodeTimeout", c.Claimer.Redlock.NodeTimeout.Duration(), 50 * time.Millisecond},
		{"SQLitePath", c.Claimer.SQLite.Path, "./scheduler.db"},
		{"SQLiteSynchronous", c.Claimer.SQLite.Synchronous, SyncFull},
		{"DatabaseKind", c.Database.Kind, DatabaseSQLite},
		{"DatabasePath", c.Database.Path, "./scheduler.db"},
		{"HTTPAddr", c.HTTP.Addr, ":8080"},
		{"LogLevel", c.Log.Level, "info"},
		{"LogFormat", c.Log.Format, "text"},
		{"ShutdownGrace", c.ShutdownGrace.Duration(), 30 * time.Second},
		{"JobTimezone", a.Timezone, "UTC"},
		{"NoRetry", a.Retry.Enabled(), false},
		{"MaxCatchup", a.Misfire.MaxCatchup, 10},
		{"RetryMaxAttemptsIsMaxAttempts", rj.MaxAttempts, 5},
		{"RetryBackoff", rj.Retry.Backoff.Duration(), 10 * time.Second},
		{"RetryMaxBackoff", rj.Retry.MaxBackoff.Duration(), 10 * time.Minute},
		{"RetryAttemptsFromJob", sj.Retry.MaxAttempts, 3},
		{"RetryMaxBackoffAtLeastBackoff", sj.Retry.MaxBackoff.Duration(), 20 * time.Minute},
		{"JobOverlap", a.Overlap, OverlapForbid},
		{"JobMaxAttempts", a.MaxAttempts, 3},
		{"JobMisfirePolicy", a.Misfire.Policy, MisfireSkip},
		{"JobMisfireGrace", a.Misfire.Grace.Duration(), time.Hour},
		{"JobEnabled", a.Enabled, true},
		{"ExplicitDisabled", b.Enabled, false},
		{"ExplicitMaxAttempts", b.MaxAttempts, 1},
		{"ExplicitZeroGrace", b.Misfire.Grace.Duration(), time.Duration(0)},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	t.Run("LeaseDefaultGivesRenewThird", func(t *testing.T) {
		c := mustLoad(t, "claimer: {kind: memory}\n")
		if c.Claimer.Lease.Duration() != 30*time.Second || c.Claimer.RenewEvery.Duration() != 10*time.Second {
			t.Errorf("lease %v renew %v", c.Claimer.Lease, c.Claimer.RenewEvery)
		}
	})
	t.Run("EmptyOrNullKeepsDefault", func(t *testing.T) {
		c := mustLoad(t, "claimer: {kind: '', lease: ~, redis: {prefix: '${CFG_TEST_UNSET:-}'}}\nlog: {level: ''}\n")
		if c.Claimer.Kind != ClaimerSQLite || c.Claimer.Lease.Duration() != 30*time.Second ||
			c.Claimer.Redis.Prefix != "scheduler:" || c.Log.Level != "info" {
			t.Errorf("kind %q lease %v prefix %q level %q", c.Claimer.Kind, c.Claimer.Lease, c.Claimer.Redis.Prefix, c.Log.Level)
		}
	})
	t.Run("PostgresClaimerDatabase", func(t *testing.T) {
		c := mustLoad(t, "claimer: {kind: postgres, postgres: {dsn: 'postgres://db/app', migrate: false}}\n")
		if c.Database.Kind != DatabasePostgres || c.Database.DSN != "postgres://db/app" || c.Claimer.Postgres.Migrate {
			t.Errorf("database %+v migrate %v", c.Database, c.Claimer.Postgres.Migrate)
		}
	})
}

func TestLoadHTTPAddr(t *testing.T) {
	for _, tt := range []struct{ name, yaml, want string }{
		{"Unset", "log: {level: info}\n", ":8080"},
		{"Null", "http:\n  addr:\n", ":8080"},
		{"EmptyDisables", "http:\n  addr: \"\"\n", ""},
		{"Set", "http:\n  addr: 127.0.0.1:9090\n", "127.0.0.1:9090"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := mustLoad(t, tt.yaml).HTTP.Addr; got != tt.want {
				t.Errorf("http.addr %q, want %q", got, tt.want)
			}
		})
	}
}

func TestExampleFileLoads(t *testing.T) {
	t.Setenv("SCHEDULER_PG_PASSWORD", secret)
	c, err := Load("../../config.example.yaml")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if err := c.Validate(func(job string) bool { return job == "billing.nightly" || job == "example.sleep" }); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	j := c.Jobs["billing.nightly"]
	if j.Schedule != "30 2 * * *" || j.Timezone != "Europe/Berlin" || j.Misfire.Policy != MisfireRunOnce || j.Misfire.Grace.Duration() != 6*time.Hour {
		t.Errorf("billing.nightly = %+v", j)
	}
	if c.Jobs["example.sleep"].Params["duration"] != "1s" {
		t.Errorf("example.sleep params = %v", c.Jobs["example.sleep"].Params)
	}
	if !strings.Contains(c.Claimer.Postgres.DSN, secret) {
		t.Errorf("DSN %q lacks the expanded password", Redact(c.Claimer.Postgres.DSN))
	}
	if err := c.Validate(func(job string) bool { return job == "example.sleep" }); err == nil ||
		!strings.Contains(err.Error(), "jobs.billing.nightly: no handler registered") {
		t.Errorf("unregistered job not reported: %v", err)
	}
}

func TestDefault(t *testing.T) {
	c := Default()
	if err := c.Validate(nil); err != nil {
		t.Fatal(err)
	}
	j, ok := c.Jobs["example.sleep"]
	if c.Claimer.Kind != ClaimerSQLite || c.Claimer.SQLite.Path != "./scheduler.db" || c.HTTP.Addr != ":8080" ||
		!ok || j.Schedule != "@every 5s" || j.Params["duration"] != "1s" || len(c.Jobs) != 1 {
		t.Errorf("Default() =\n%s", c)
	}
}

func TestSecretsStayHidden(t *testing.T) {
	t.Setenv("CFG_TEST_PW", secret)
	c := mustLoad(t, `
claimer:
  kind: postgres
  postgres: {dsn: "postgres://app:${CFG_TEST_PW}@db/app?sslpassword=${CFG_TEST_PW}"}
  redis: {password: "${CFG_TEST_PW}"}
  redlock: {password: "${CFG_TEST_PW}"}
jobs:
  a:
    schedule: "@daily"
    params: {api_token: "${CFG_TEST_PW}", nested: {password: "${CFG_TEST_PW}"}, ok: visible}
`)
	for name, s := range map[string]string{
		"String":        c.String(),
		"Redacted":      c.Redacted(),
		"%v":            fmt.Sprintf("%v", c),
		"%+v value":     fmt.Sprintf("%+v", *c),
		"%#v redis":     fmt.Sprintf("%#v", c.Claimer.Redis),
		"%+v claimer":   fmt.Sprintf("%+v", c.Claimer),
		"%v database":   fmt.Sprintf("%v", c.Database),
		"%+v postgres":  fmt.Sprintf("%+v", c.Claimer.Postgres),
		"password text": c.Claimer.Redis.Password.String(),
	} {
		if strings.Contains(s, secret) {
			t.Errorf("%s leaks the secret:\n%s", name, s)
		}
	}
	if !strings.Contains(c.Redacted(), "visible") || !strings.Contains(c.Redacted(), "postgres://app:xxxxx@db/app") {
		t.Errorf("Redacted hides too much:\n%s", c.Redacted())
	}
}

func TestRedact(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"postgres://app:hunter2@db:5432/app", "postgres://app:xxxxx@db:5432/app"},
		{"postgresql://app@db/app", "postgresql://app@db/app"},
		{"postgres://db/app?user=u&password=hunter2&sslmode=require", "postgres://db/app?user=u&password=xxxxx&sslmode=require"},
		{"postgres://u:pa/ss@w?rd@db/app", "postgres://u:xxxxx@db/app"},
		{"postgres://u:p@ss@db/app", "postgres://u:xxxxx@db/app"},
		{"host=db user=u password=hunter2 dbname=app", "host=db user=u password=xxxxx dbname=app"},
		{"host=db password = 'hun ter\\'2' sslpassword=k", "host=db password = xxxxx sslpassword=xxxxx"},
		{"host=db password='unterminated", "host=db password=xxxxx"},
		{"u:hunter2@db/app", "u:xxxxx@db/app"},
		{"redis://:hunter2@h:6379/0", "redis://:xxxxx@h:6379/0"},
		{"localhost:6379", "localhost:6379"},
		{"", ""},
	} {
		if got := Redact(tt.in); got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestRedactError(t *testing.T) {
	// pgx repeats this spelling's password in its own message.
	dsn := "host=db password = " + secret + " port=abc"
	_, err := pgconn.ParseConfig(dsn)
	if got := RedactError(err, dsn).Error(); strings.Contains(got, secret) || !strings.Contains(got, "invalid port") {
		t.Errorf("RedactError = %q", got)
	}
	if RedactError(nil, dsn) != nil {
		t.Error("RedactError(nil) is not nil")
	}
}

func TestRedactValue(t *testing.T) {
	for _, tt := range []struct{ name, value, want string }{
		{"password", "hunter2", "xxxxx"},
		{"API_Token", "t0k", "xxxxx"},
		{"password_file", "/run/secrets/pw", "/run/secrets/pw"},
		{"dsn", "postgres://u:hunter2@h/db", "postgres://u:xxxxx@h/db"},
		{"addr", "redis://:hunter2@h:6379", "redis://:xxxxx@h:6379"},
		{"schedule", "@daily", "@daily"},
		{"password", "", ""},
	} {
		if got := redactValue(tt.name, tt.value); got != tt.want {
			t.Errorf("redactValue(%q, %q) = %q, want %q", tt.name, tt.value, got, tt.want)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "absent.yaml"))
	var ce *Error
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "absent.yaml: cannot read") {
		t.Errorf("got %v", err)
	}
}

func FuzzLoad(f *testing.F) {
	example, err := os.ReadFile("../../config.example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range [][]byte{
		example, defaultYAML, nil,
		[]byte("claimer: {kind: redlock, redlock: {addrs: [a:1, a:1]}}\nlease: 30\n"),
		[]byte("jobs:\n  x: &a {schedule: '@daily'}\n  y: {<<: *a, timezone: Mars}\n"),
		[]byte("a: [\n"), []byte("---\n---\n"), []byte("${X:-"), []byte("http: {addr: ''}"),
		[]byte("jobs: {a: {params: {x: [1, {y: 2}]}, misfire: {grace: 1h}}}"),
	} {
		f.Add(seed)
	}
	lookup := func(name string) (string, bool) {
		if name == "SET" {
			return "value", true
		}
		return "", false
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parse("fuzz.yaml", data, lookup)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error is not a *config.Error: %v", err)
			}
			return
		}
		if c == nil {
			t.Fatal("nil config without error")
		}
		if err := c.Validate(nil); err != nil {
			t.Fatalf("loaded config fails Validate: %v", err)
		}
		_ = c.Redacted()
	})
}

// A job without a handler is one more problem of the file, reported with
// the others and its line: an operator who fixed the schedule must not
// find out about the handler on the next start.
func TestLoadForReportsAnUnregisteredJobWithTheFilesOtherProblems(t *testing.T) {
	path := write(t, "claimer:\n  kind: memory\njobs:\n  billing.nightly:\n    schedule: \"* * * *\"\n  reports.hourly:\n    schedule: \"@hourly\"\n")
	_, err := LoadFor(path, func(job string) bool { return job == "billing.nightly" })
	var lines []string
	for _, e := range unjoin(err) {
		var ce *Error
		if !errors.As(e, &ce) {
			t.Fatalf("%T %v is not an *Error", e, e)
		}
		lines = append(lines, fmt.Sprintf("%d %s", ce.Line, ce.Key))
	}
	want := []string{"5 jobs.billing.nightly.schedule", "6 jobs.reports.hourly"}
	if !slices.Equal(lines, want) {
		t.Fatalf("problems at %q, want %q (%v)", lines, want, err)
	}
	if _, err := LoadFor(path, nil); err == nil || strings.Contains(err.Error(), "no handler") {
		t.Fatalf("LoadFor(nil) checks handlers: %v", err)
	}
}
