package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/tracing"
	"github.com/scheduler-dev/scheduler/migrations"
)

// openBackend opens the configured claimer through the one opener that
// `scheduler compare`, the benchmarks and the tests use too. migrate
// applies pending SQL migrations first (sqlite always; postgres when
// configured).
func openBackend(ctx context.Context, cfg *config.Config, migrate bool) (*claimers.Backend, error) {
	return claimers.Open(ctx, cfg.Claimer, cfg.InstanceID, claimers.Options{Migrate: migrate})
}

// errSchemaBehind says a command other than run found the SQL schema
// short of this binary's migrations.
var errSchemaBehind = errors.New("the database schema lacks this version's migrations: run `scheduler migrate up`, " +
	"or start a replica (`scheduler run` applies them when claimer.postgres.migrate is set)")

// openExisting is openForCommand for the commands that read the fleet's
// state or write to the fleet (runs, prune, pause, resume, trigger): on
// the embedded SQLite file they refuse a path that
// names no file, which opening would create, migrated and empty. An
// operator who looked at the history through a mistyped path, or after
// the file was deleted, would have made a file that replicas started
// later join, fences starting over; a pause or a run requested there
// would reach no replica (found by an outside review). trigger --here and
// backfill run the job themselves, as a replica would, and may create it.
func openExisting(ctx context.Context, cfg *config.Config) (*claimers.Backend, error) {
	if err := sqliteMissing(cfg); err != nil {
		return nil, err
	}
	return openForCommand(ctx, cfg)
}

// sqliteMissing says so if cfg's claimer is the SQLite file and its path
// names no file.
func sqliteMissing(cfg *config.Config) error {
	if cfg.Claimer.Kind != config.ClaimerSQLite {
		return nil
	}
	path := cfg.Claimer.SQLite.Path
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no database at %s (claimer.sqlite.path): no replica has run with this configuration;"+
			" `scheduler run` creates it", path)
	}
	return nil
}

// openForCommand opens cfg's backend for an operator's command (runs,
// pause, trigger, backfill, prune…). It never changes the schema: only
// `scheduler run` and `scheduler migrate up` do. A newer binary's
// `scheduler runs` applying its migrations under a fleet of older
// replicas (one of them copies the whole runs table while claims wait,
// and makes the older replicas fail closed) was found by an outside
// review. A schema behind the binary is an error that says what to do.
// (The embedded SQLite file is migrated by every command that opens it,
// as it always was: it is the one process's own.)
func openForCommand(ctx context.Context, cfg *config.Config) (*claimers.Backend, error) {
	b, err := openBackend(ctx, cfg, false)
	if err != nil || b.DB == nil {
		return b, err
	}
	current, err := migrations.Current(ctx, b.DB, b.Dialect)
	var down error
	if err != nil {
		down = b.Ping(ctx)
	}
	switch {
	case down != nil:
		// Said first, where "migration status" led an operator to the
		// schema when the server was down (found by an outside review).
		err = fmt.Errorf("the database does not answer: %w", down)
	case err != nil:
		err = fmt.Errorf("migration status: %w", err)
	case !current:
		err = errSchemaBehind
	}
	if err != nil {
		_ = b.Close()
		return nil, err
	}
	return b, nil
}

// newLogger builds the process logger from log.level and log.format. It
// also becomes go-redis's logger, which is process-wide. A record logged
// with a traced context carries its trace_id and span_id.
func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Log.Level)) // validated already
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	if cfg.Log.Format == "json" {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = slog.NewTextHandler(w, opts)
	}
	log := slog.New(tracing.LogHandler(h)) // trace_id, span_id from the context, when traced
	goredis.SetLogger(redisLogger{log.With("component", "go-redis")})
	return log
}

// go-redis prints its own messages (a pool that cannot dial, …) as plain
// text on stderr, beside a command's output, in no configured format;
// every command says what failed in its own words (an outside review
// found `scheduler runs` with a Redlock node down printing one per dial).
// So they are dropped from the start, set while the process is still
// single-threaded (SetLogger is a plain write of a global), and `run`
// takes them into its log (newLogger).
func init() { goredis.SetLogger(quietRedis{}) }

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// redisLogger takes go-redis's own messages (a pool that cannot dial, …),
// which it would print as plain text on stderr, into the process log, where
// JSON stays JSON. They repeat failures the caller logs once at error, so
// they go to debug.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, v...))
}
