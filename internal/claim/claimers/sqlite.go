package claimers

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"

	"github.com/scheduler-dev/scheduler/internal/claim/sqlite"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/migrations"
)

// sqliteDriver: one file that every process on the host opens.
var sqliteDriver = driver{
	open: func(ctx context.Context, c config.Claimer, instance string, _ Options) (*Backend, error) {
		cl, err := sqlite.Open(ctx, c.SQLite.Path, sqlite.Options{Instance: instance,
			SyncNormal: c.SQLite.Synchronous == config.SyncNormal})
		if err != nil {
			return nil, err
		}
		db, err := sql.Open("sqlite", migrations.SQLiteDSN(c.SQLite.Path))
		if err != nil {
			_ = cl.Close()
			return nil, err
		}
		return &Backend{Claimer: cl, Pruner: cl, Controls: cl.Controls(), DB: db, Dialect: migrations.SQLite,
			Lost: cl.Lost(), LostErr: cl.LostErr,
			closers: []func(){func() { _ = db.Close() }}}, nil
	},
	servers: noServers,
	dial:    noDial,
	// isolate puts the namespace's file beside c's, and migrates it before
	// replicas race to open it.
	isolate: func(ctx context.Context, c *config.Claimer, name string) (func() error, error) {
		dir := filepath.Dir(c.SQLite.Path)
		if c.SQLite.Path == "" {
			dir = os.TempDir()
		}
		c.SQLite.Path = filepath.Join(dir, name+".db")
		cl, err := sqlite.Open(ctx, c.SQLite.Path, sqlite.Options{Instance: "migrate"})
		if err != nil {
			return nil, err
		}
		_ = cl.Close()
		path := c.SQLite.Path
		return func() error {
			var errs []error
			for _, suffix := range []string{"", "-wal", "-shm"} {
				if err := os.Remove(path + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		}, nil
	},
}
