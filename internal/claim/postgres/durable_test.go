package postgres_test

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/scheduler-dev/scheduler/internal/claim/postgres"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// TestCommitsAreFlushedWhateverTheDatabaseSays: under synchronous_commit
// off, set on the database (or a role, or in the DSN), a server crash
// loses commits it had acknowledged, and a run whose release was lost is
// taken over and run again. The claimer's sessions commit with it on.
func TestCommitsAreFlushedWhateverTheDatabaseSays(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	ctx := t.Context()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "sync_" + hex.EncodeToString(b)
	for _, q := range []string{"CREATE DATABASE " + name, "ALTER DATABASE " + name + " SET synchronous_commit = off"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := testenv.CleanupContext()
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
		_ = admin.Close(ctx)
	})
	setting := func(t *testing.T, query string, tune bool) string {
		t.Helper()
		pc, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		pc.ConnConfig.Database = name
		if query != "" {
			pc.ConnConfig.RuntimeParams["synchronous_commit"] = query
		}
		if tune {
			postgres.Tune(pc)
			pc = postgres.LeasePool(pc) // a copy: the lease pool's sessions too
		}
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		var v string
		if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := setting(t, "", false); v != "off" {
		t.Fatalf("the database's own setting reads %q, want off (the test's premise)", v)
	}
	for dsnSays, want := range map[string]string{"": "on", "off": "on", "remote_apply": "remote_apply", "local": "local"} {
		if v := setting(t, dsnSays, true); v != want {
			t.Errorf("DSN synchronous_commit %q, database off: the claimer's sessions commit with %q, want %q", dsnSays, v, want)
		}
	}
}
