package redisnode

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// TestKeyLayout pins both layouts: a single server's names are the ones
// every earlier release wrote (an upgrade finds its data), and on a
// cluster every key of a job carries one hash tag, its bucket's.
func TestKeyLayout(t *testing.T) {
	run := claim.Run{Job: "billing.nightly", At: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
	id := run.ID()

	plain := keys{prefix: "scheduler:"}
	for got, want := range map[string]string{
		plain.run(id):                   "scheduler:run:billing.nightly@2026-01-02T03:04:00Z",
		plain.fence(run.Job):            "scheduler:fence:billing.nightly",
		plain.runs(run.Job):             "scheduler:runs:billing.nightly",
		plain.jobs(0):                   "scheduler:jobs",
		plain.marker(0):                 "scheduler:server",
		plain.controls():                "scheduler:controls",
		plain.in(plain.bucket(run.Job)): "scheduler:",
	} {
		if got != want {
			t.Errorf("single server: key %q, want %q", got, want)
		}
	}
	if plain.count() != 1 {
		t.Errorf("single server: %d buckets, want 1", plain.count())
	}

	cluster := keys{prefix: "scheduler:", tagged: true}
	b := cluster.bucket(run.Job)
	tag := "{" + strconv.Itoa(b) + "}"
	for _, k := range []string{cluster.run(id), cluster.fence(run.Job), cluster.runs(run.Job), cluster.jobs(b), cluster.marker(b)} {
		if !strings.HasPrefix(k, "scheduler:"+tag) || strings.Count(k, "{") != 1 {
			t.Errorf("cluster: key %q, want it to start with scheduler:%s and hold no other brace", k, tag)
		}
	}
	if got := cluster.run(id); got != "scheduler:"+tag+"run:"+id {
		t.Errorf("cluster: run key %q", got)
	}
	// A job name holding "@" still finds its bucket from the run id.
	odd := claim.Run{Job: "team@billing", At: run.At}
	if got, want := cluster.run(odd.ID()), cluster.in(cluster.bucket(odd.Job))+"run:"+odd.ID(); got != want {
		t.Errorf("cluster: run key %q, want %q", got, want)
	}
	seen := map[int]bool{}
	for i := range 4096 {
		seen[cluster.bucket("job."+strconv.Itoa(i))] = true
	}
	if len(seen) != Buckets {
		t.Errorf("4096 jobs fill %d buckets, want all %d", len(seen), Buckets)
	}
}
