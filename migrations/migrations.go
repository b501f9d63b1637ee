// Package migrations holds the goose SQL migrations of the SQL claimers,
// embedded, one directory per dialect, and applies them with goose's Provider
// API: no global goose state, so parallel callers (and tests) are safe.
//
// Migrations are append-only: add NNNNN_name.sql to both directories, never
// edit one that has been applied.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"hash/crc64"
	"io/fs"
	"math/rand/v2"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

//go:embed postgres/*.sql sqlite/*.sql
var files embed.FS

// Dialect selects a migration directory and goose's SQL dialect.
type Dialect string

// Supported dialects.
const (
	Postgres Dialect = "postgres"
	SQLite   Dialect = "sqlite"
)

// SQLiteDSN is the modernc.org/sqlite data source name for the file at path
// that every user of the SQLite schema opens it with (the sqlite claimer
// adds its synchronous setting): WAL journal (readers never block the
// writer), a 5s busy timeout (how long a write waits for another
// connection's), and explicit transactions that take the write lock at
// BEGIN (IMMEDIATE), so they cannot fail half-way on a lock.
func SQLiteDSN(path string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath() +
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate"
}

// ErrNoMigration is returned by Down when no migration is applied.
var ErrNoMigration = errors.New("migrations: no applied migration to roll back")

// Migration is the state of one migration in a database.
type Migration struct {
	Version   int64
	Name      string // file name, e.g. 00001_create_runs.sql
	Applied   bool
	AppliedAt time.Time // zero when pending
}

// String renders a status line: "applied 2026-01-02T03:04:05Z 00001_create_runs.sql".
func (m Migration) String() string {
	if !m.Applied {
		return fmt.Sprintf("pending %-20s %s", "", m.Name)
	}
	return fmt.Sprintf("applied %-20s %s", m.AppliedAt.UTC().Format(time.RFC3339), m.Name)
}

// Up applies every pending migration.
//
// Several replicas may run Up at once. On PostgreSQL a session advisory lock,
// keyed by the current schema, serializes them. SQLite has no lock that
// spans goose's statements, so a replica that loses the race to another
// process tries again until nothing is pending. It waits a little, jittered,
// before each new try: two processes opening a new file at once both switch
// it to WAL, which needs the file's exclusive lock, and SQLite answers one
// of them busy at once rather than wait out the busy timeout, since each
// holds what the other waits for. Tried again at once, the same race was
// lost every round (an outside CI run: one of two replicas started
// together failed to start, "database is locked"). Busy answers are tried
// again for up to sqliteBusyFor; other failures a bounded number of times.
func Up(ctx context.Context, db *sql.DB, d Dialect) error {
	p, err := provider(ctx, db, d)
	if err != nil {
		return err
	}
	// Each failed round that was not busy means another process applied at
	// least the migration this one tried, so the number of migrations
	// bounds those rounds.
	rounds := len(p.ListSources()) + 1
	start, wait := time.Now(), 10*time.Millisecond
	for {
		_, err = p.Up(ctx)
		if err == nil || d != SQLite || ctx.Err() != nil {
			break
		}
		if pending, perr := p.HasPending(ctx); perr == nil && !pending {
			return nil
		}
		if !busy(err) || time.Since(start) > sqliteBusyFor {
			if rounds--; rounds == 0 {
				break
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrations: up (%s): %w", d, errors.Join(err, ctx.Err()))
		case <-time.After(wait/2 + rand.N(wait)):
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("migrations: up (%s): %w", d, err)
	}
	return nil
}

// sqliteBusyFor is how long Up keeps trying SQLite migrations that were
// answered busy: other replicas' opens and migrations take milliseconds,
// and a busy timeout (5s) already waited for a writer.
const sqliteBusyFor = 15 * time.Second

// busy says whether err is SQLite's SQLITE_BUSY (or SQLITE_LOCKED): another
// connection held a lock that this one needed.
func busy(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	code := se.Code() & 0xff // the primary result code
	return code == sqlite3.SQLITE_BUSY || code == sqlite3.SQLITE_LOCKED
}

// UpTo applies the pending migrations up to and including version: a
// database as an older release left it, for upgrade tests and benchmarks.
func UpTo(ctx context.Context, db *sql.DB, d Dialect, version int64) error {
	p, err := provider(ctx, db, d)
	if err != nil {
		return err
	}
	if _, err := p.UpTo(ctx, version); err != nil {
		return fmt.Errorf("migrations: up to %d (%s): %w", version, d, err)
	}
	return nil
}

// Down rolls back the most recently applied migration.
func Down(ctx context.Context, db *sql.DB, d Dialect) error {
	p, err := provider(ctx, db, d)
	if err != nil {
		return err
	}
	if _, err := p.Down(ctx); err != nil {
		if errors.Is(err, goose.ErrNoNextVersion) {
			return ErrNoMigration
		}
		return fmt.Errorf("migrations: down (%s): %w", d, err)
	}
	return nil
}

// Drops names what rolling back the migration called name (a file name,
// as Migration.Name gives it) of dialect d drops, as "table x" or
// "function f": the objects a `migrate down` destroys with their data.
func Drops(d Dialect, name string) ([]string, error) {
	fsys, err := dialectFS(d)
	if err != nil {
		return nil, err
	}
	src, err := fs.ReadFile(fsys, name)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	_, down, _ := strings.Cut(string(src), "-- +goose Down")
	var out []string
	for line := range strings.Lines(down) {
		f := strings.Fields(strings.TrimSuffix(strings.TrimSpace(line), ";"))
		if len(f) >= 3 && strings.EqualFold(f[0], "DROP") {
			obj, _, _ := strings.Cut(f[2], "(")
			out = append(out, strings.ToLower(f[1])+" "+obj)
		}
	}
	return out, nil
}

// Status lists every known migration, oldest first, applied or pending.
func Status(ctx context.Context, db *sql.DB, d Dialect) ([]Migration, error) {
	p, err := provider(ctx, db, d)
	if err != nil {
		return nil, err
	}
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: status (%s): %w", d, err)
	}
	out := make([]Migration, 0, len(st))
	for _, s := range st {
		out = append(out, Migration{
			Version:   s.Source.Version,
			Name:      path.Base(s.Source.Path),
			Applied:   s.State == goose.StateApplied,
			AppliedAt: s.AppliedAt,
		})
	}
	return out, nil
}

// Current reports whether every known migration is applied. Readiness uses
// it: a replica must not claim runs against a schema it does not know. A
// database migrated further by a newer release is current for this one.
func Current(ctx context.Context, db *sql.DB, d Dialect) (bool, error) {
	p, err := provider(ctx, db, d)
	if err != nil {
		return false, err
	}
	pending, err := p.HasPending(ctx)
	if err != nil {
		return false, fmt.Errorf("migrations: check (%s): %w", d, err)
	}
	return !pending, nil
}

// dialectFS returns the migration directory of dialect d.
func dialectFS(d Dialect) (fs.FS, error) {
	switch d {
	case Postgres, SQLite:
		return fs.Sub(files, string(d))
	}
	return nil, fmt.Errorf("migrations: unknown dialect %q", d)
}

func provider(ctx context.Context, db *sql.DB, d Dialect) (*goose.Provider, error) {
	fsys, err := dialectFS(d)
	if err != nil {
		return nil, err
	}
	opts := []goose.ProviderOption{goose.WithDisableGlobalRegistry(true)}
	dialect := goose.DialectSQLite3
	if d == Postgres {
		dialect = goose.DialectPostgres
		locker, err := schemaLocker(ctx, db)
		if err != nil {
			return nil, err
		}
		opts = append(opts, goose.WithSessionLocker(locker))
	}
	p, err := goose.NewProvider(dialect, db, fsys, opts...)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// schemaLocker returns an advisory-lock locker whose key is derived from the
// current schema: migrations of one schema are serialized across replicas,
// while migrations of different schemas in one database (parallel tests) do
// not wait for each other.
func schemaLocker(ctx context.Context, db *sql.DB) (lock.SessionLocker, error) {
	var schema sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return nil, fmt.Errorf("migrations: current schema: %w", err)
	}
	sum := crc64.Checksum([]byte("scheduler migrations "+schema.String), crc64.MakeTable(crc64.ECMA))
	// Wait up to 5 minutes (probing every second) for a replica that is
	// migrating the same schema: migrations may legitimately take that long.
	return lock.NewPostgresSessionLocker(lock.WithLockID(int64(sum>>1)), lock.WithLockTimeout(1, 300))
}
