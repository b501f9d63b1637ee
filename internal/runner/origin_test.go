package runner

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/job"
)

// An overlap probe (liveBefore) that wins an earlier instant this replica
// only watched runs it as its watcher would have: here a request sent
// with --overlap allow, watched but not bid for yet when a later instant
// of the forbid job probed. Handed on as a plain scheduled instant, it
// obeyed the job's policy and was skipped behind the run already live.
func TestAProbeThatWinsAWatchedRequestRunsItAsRequested(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		sched, err := schedule.Parse("* * * * *", "")
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan time.Time, 4)
		stop := make(chan struct{})
		handler := func(ctx context.Context, run job.Run) error {
			started <- run.ScheduledAt
			select {
			case <-stop:
			case <-ctx.Done():
			}
			return nil
		}
		mem := memory.New(memory.NewStore(time.Now), "r1")
		r, err := New(Options{Claimer: mem, Instance: "r1", Lease: 2 * time.Second},
			[]Job{{Name: "sync", Schedule: sched, Handler: handler, Overlap: OverlapForbid}})
		if err != nil {
			t.Fatal(err)
		}
		var standby, exec sync.WaitGroup
		d := r.dispatcher(&standby, &exec)
		j := r.jobs[0]

		// The job's instant runs here, and goes on running.
		t0 := time.Now().UTC().Truncate(time.Minute)
		cl, err := d.claim(ctx, claim.Run{Job: "sync", At: t0})
		if err != nil {
			t.Fatal(err)
		}
		d.granted(ctx, ctx, j, cl, origin{})
		synctest.Wait()
		if got := len(started); got != 1 {
			t.Fatalf("%d runs started, want the instant's", got)
		}
		<-started

		// A request to run it now, alongside: dispatched (watched here),
		// its first bid not sent yet when the next instant probes.
		time.Sleep(1500 * time.Millisecond)
		req := control.Request{ID: "q1", Job: "sync", At: control.ManualInstant(time.Now()),
			By: "ops", Overlap: OverlapAllow}
		j.watch(req.At, origin{request: &req})
		if n := d.liveBefore(ctx, ctx, j, t0.Add(time.Minute), 2); n != 2 {
			t.Errorf("the probe counted %d live runs before the next instant, want 2", n)
		}
		synctest.Wait()
		select {
		case at := <-started:
			if !at.Equal(req.At) {
				t.Fatalf("started %v, want the request's run %v", at, req.At)
			}
		default:
			recs, _ := mem.History(ctx, "sync", 10)
			t.Fatalf("the request's run, won by the probe, did not start beside the live run: history %+v", recs)
		}
		j.setLive(req.At, watching, -1)
		if o := j.watchedOrigin(req.At); o != (origin{}) {
			t.Errorf("the watch ended, its origin stays: %+v", o)
		}
		close(stop)
		cancel()
		standby.Wait()
		exec.Wait()
	})
}

// countedControls counts the register's reads of requests.
type countedControls struct {
	claim.Controls
	reads atomic.Int32
}

func (c *countedControls) List(ctx context.Context, prefix string) ([]claim.Control, error) {
	if strings.HasPrefix(prefix, "request") {
		c.reads.Add(1)
	}
	return c.Controls.List(ctx, prefix)
}

// A manual run no request names (a trigger --here run the sweep adopts,
// a backfill's rerun) is looked up in the register once: a request is
// written before any claim of its run, so the answer cannot change, and
// start, the grant and the overlap skip's re-check would each read it
// again. A request's run is still found, from the register or the last
// read.
func TestAManualRunNoRequestNamesIsLookedUpOnce(t *testing.T) {
	ctx := t.Context()
	store := memory.NewStore(time.Now)
	reg := &countedControls{Controls: store.Controls()}
	sched, err := schedule.Parse("* * * * *", "")
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Options{Claimer: memory.New(store, "r1"), Instance: "r1", Controls: control.New(reg, nil)},
		[]Job{{Name: "sync", Schedule: sched, Handler: func(context.Context, job.Run) error { return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	here := claim.Run{Job: "sync", At: control.ManualInstant(time.Now())}
	for range 3 {
		if q := r.requestOf(ctx, here); q != nil {
			t.Fatalf("requestOf(%s) = %+v, want none", here.ID(), q)
		}
	}
	if n := reg.reads.Load(); n != 1 {
		t.Errorf("the register was read %d times for one run no request names, want once", n)
	}
	req, _, err := control.New(store.Controls(), nil).Request(ctx, control.Request{Job: "sync", By: "ops", Overlap: OverlapAllow})
	if err != nil {
		t.Fatal(err)
	}
	if q := r.requestOf(ctx, req.Run()); q == nil || q.ID != req.ID || q.Overlap != OverlapAllow {
		t.Errorf("requestOf(%s) = %+v, want request %s", req.Run().ID(), q, req.ID)
	}
}
