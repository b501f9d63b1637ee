package cli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/cli"
	"github.com/scheduler-dev/scheduler/internal/control"
)

// `migrate down` drops what the newest migration created, with its data
// (00002: every invoice), and leaves a fleet on the schema failing closed:
// an outside review ran it beside three replicas, and it said nothing of
// either. It names the migration and what it drops, and rolls back only
// with --yes (exit 2 without); it refuses while any replica is up
// (exit 1, naming them), --yes or not. (SQLite: every command that opens
// the file migrates it up first, so only the newest one rolls back;
// TestMigrateOnPostgresAndRunsFromRedis goes further down.)
func TestMigrateDownNamesWhatItDropsAndWaitsForTheFleet(t *testing.T) {
	dir, path, b := sqliteBackend(t, "  example.sleep:\n    schedule: \"@daily\"\n")
	defer b.Close()
	status := func() string {
		t.Helper()
		code, out, errOut := mainIn(t, dir, "migrate", "status", "--config", path)
		if code != cli.ExitOK {
			t.Fatalf("migrate status: exit %d, %s", code, errOut)
		}
		return out
	}
	before := status()
	if strings.Contains(before, "pending") {
		t.Fatalf("not migrated: %s", before)
	}

	code, out, errOut := mainIn(t, dir, "migrate", "down", "--config", path)
	if code != cli.ExitUsage || !strings.Contains(errOut, "00005_probe_waits_for_grants.sql") || !strings.Contains(errOut, "--yes") {
		t.Errorf("migrate down without --yes: exit %d, stdout %q, stderr %q; want 2, naming the migration and --yes", code, out, errOut)
	}
	if after := status(); after != before {
		t.Fatalf("migrate down without --yes changed the schema:\n%s", after)
	}

	// A replica up: refused, --yes or not.
	ctl := control.New(b.Controls, nil)
	if err := ctl.Announce(t.Context(), "replica-b", time.Minute); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = mainIn(t, dir, "migrate", "down", "--yes", "--config", path)
	if code != cli.ExitRuntime || !strings.Contains(errOut, "replica-b") {
		t.Errorf("migrate down --yes beside a replica: exit %d, stderr %q; want 1 naming it", code, errOut)
	}
	if after := status(); after != before {
		t.Fatalf("migrate down beside a replica changed the schema:\n%s", after)
	}
	if err := ctl.Leave(t.Context(), "replica-b"); err != nil {
		t.Fatal(err)
	}

	code, out, errOut = mainIn(t, dir, "migrate", "down", "--yes", "--config", path)
	if code != cli.ExitOK || !strings.Contains(out, "rolled back 00005_probe_waits_for_grants.sql") || !strings.Contains(out, "pending") {
		t.Fatalf("migrate down --yes: exit %d, stdout %q, stderr %q; want 0 and 00005 rolled back", code, out, errOut)
	}
}
