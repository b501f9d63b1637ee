package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/tracing"
)

// openBackend opens the configured claimer through the one opener that
// `scheduler compare`, the benchmarks and the tests use too. migrate
// applies pending SQL migrations first (sqlite always; postgres when
// configured).
func openBackend(ctx context.Context, cfg *config.Config, migrate bool) (*claimers.Backend, error) {
	return claimers.Open(ctx, cfg.Claimer, cfg.InstanceID, claimers.Options{Migrate: migrate})
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

// redisLogger takes go-redis's own messages (a pool that cannot dial, …),
// which it would print as plain text on stderr, into the process log, where
// JSON stays JSON. They repeat failures the caller logs once at error, so
// they go to debug.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, v...))
}
