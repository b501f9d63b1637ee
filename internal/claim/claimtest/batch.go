package claimtest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// batchCases check that a batch answers each run as a single claim would.
func batchCases(t *testing.T, newClaimers Factory, opts Options) {
	t.Run("BatchClaimAnswersEachRunLikeClaim", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("replica-a"), open("replica-b")
		held, done, interrupted, fresh := runAt("job.batch", 0), runAt("job.batch", 1), runAt("job.batch", 2), runAt("job.batch", 3)
		mustClaim(t, a, held, longLease)
		if err := claim.ReleaseOne(ctxT(t), a, mustClaim(t, a, done, longLease), claim.Succeeded); err != nil {
			t.Fatal(err)
		}
		first := mustClaim(t, a, interrupted, longLease)
		if err := claim.ReleaseOne(ctxT(t), a, first, claim.Interrupted); err != nil {
			t.Fatal(err)
		}
		runs := []claim.Run{held, done, interrupted, fresh, {Job: "", At: base}}
		cls, errs := b.Claim(ctxT(t), runs, longLease)
		if len(cls) != len(runs) || len(errs) != len(runs) {
			t.Fatalf("ClaimBatch of %d runs returned %d claims and %d errors", len(runs), len(cls), len(errs))
		}
		for i := range runs {
			if (cls[i] == nil) == (errs[i] == nil) {
				t.Fatalf("run %d: claim %v and error %v: want exactly one", i, cls[i], errs[i])
			}
		}
		wantErr(t, errs[0], claim.ErrHeld, "batch claim of a held run")
		wantErr(t, errs[1], claim.ErrDone, "batch claim of a done run")
		wantErr(t, errs[4], claim.ErrInvalid, "batch claim of a run without a job")
		if c := cls[2]; c.Attempt != 2 || c.Fence <= first.Fence || c.Holder != "replica-b" || c.Run.ID() != interrupted.ID() {
			t.Fatalf("batch takeover = %+v; want attempt 2, fence > %d, holder replica-b", c, first.Fence)
		}
		if c := cls[3]; c.Attempt != 1 || c.Fence <= 0 || c.Token == "" || c.Requested.IsZero() || c.Lease != longLease {
			t.Fatalf("batch grant = %+v; want attempt 1, a fence, a token, Requested and Lease set", c)
		}
		// The grants are ordinary claims.
		_, err := claim.ClaimOne(ctxT(t), a, fresh, longLease)
		wantErr(t, err, claim.ErrHeld, "single claim of a batch-granted run")
		if err := b.Renew(ctxT(t), cls[3], longLease); err != nil {
			t.Fatalf("renew a batch grant: %v", err)
		}
		if err := claim.ReleaseOne(ctxT(t), b, cls[2], claim.Succeeded); err != nil {
			t.Fatalf("release a batch grant: %v", err)
		}
		// Edge cases.
		if cls, errs := b.Claim(ctxT(t), nil, longLease); len(cls) != 0 || len(errs) != 0 {
			t.Fatalf("empty batch: %v %v", cls, errs)
		}
		_, errs = b.Claim(ctxT(t), []claim.Run{runAt("job.batch", 9)}, 0)
		wantErr(t, errs[0], claim.ErrInvalid, "batch with zero lease")
	})

	t.Run("HistoriesAnswerEachJobAsHistoryDoes", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a := open("replica-a")
		end := func(run claim.Run, o claim.Status) {
			t.Helper()
			if err := claim.ReleaseOne(ctxT(t), a, mustClaim(t, a, run, longLease), o); err != nil {
				t.Fatal(err)
			}
		}
		for i, o := range []claim.Status{claim.Succeeded, claim.Failed, claim.Succeeded, claim.Skipped} {
			end(runAt("job.hists.a", i), o)
		}
		mustClaim(t, a, runAt("job.hists.a", 4), longLease)
		end(runAt("job.hists.b", 0), claim.Interrupted)
		mustClaim(t, a, runAt("job.hists.b", 1), longLease)
		mustClaim(t, a, runAt("job.hists.c", 0), longLease) // a job not asked about
		qs := []claim.HistoryQuery{
			{Job: "job.hists.a", Limit: 2}, {Job: "job.hists.b", Limit: 0}, {Job: "job.hists.none", Limit: 5},
			{Job: "job.hists.a", Limit: 10}, {Job: "job.hists.a", Limit: 2},
		}
		hists, err := claim.Histories(ctxT(t), a, qs)
		if err != nil || len(hists) != len(qs) {
			t.Fatalf("histories of %d queries: %d answers, %v", len(qs), len(hists), err)
		}
		wantLen := []int{2, 2, 0, 5, 2}
		for i, q := range qs {
			one, err := a.History(ctxT(t), q.Job, q.Limit)
			if err != nil {
				t.Fatalf("history %+v: %v", q, err)
			}
			if len(hists[i]) != wantLen[i] || len(one) != wantLen[i] {
				t.Fatalf("query %+v: Histories gave %d records, History %d; want %d", q, len(hists[i]), len(one), wantLen[i])
			}
			for k := range one {
				if got, want := hists[i][k], one[k]; !sameRecord(got, want) {
					t.Fatalf("query %+v, record %d: Histories gave %+v, History %+v", q, k, got, want)
				}
			}
		}
		if hists[0][0].Status != claim.Running || hists[0][1].Status != claim.Skipped {
			t.Fatalf("newest two of job.hists.a = %+v; want running, then skipped", hists[0])
		}
		if _, err := claim.Histories(ctxT(t), a, []claim.HistoryQuery{{Job: ""}}); !errors.Is(err, claim.ErrInvalid) {
			t.Fatalf("a query without a job: %v, want ErrInvalid", err)
		}
		if hists, err := claim.Histories(ctxT(t), a, nil); err != nil || len(hists) != 0 {
			t.Fatalf("no queries: %v, %v", hists, err)
		}
	})

	t.Run("BatchAndSingleClaimersRaceOneWinnerPerRun", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		var clients []claim.Claimer
		for g := 0; g < 4; g++ {
			clients = append(clients, open(fmt.Sprintf("replica-%d", g)))
		}
		n := max(opts.Runs/4, 50)
		runs := make([]claim.Run, n)
		for i := range runs {
			runs[i] = runAt("job.batchrace", i)
		}
		type win struct {
			run   int
			fence int64
		}
		var (
			mu   sync.Mutex
			wins []win
			fail []error
			wg   sync.WaitGroup
		)
		record := func(i int, cl *claim.Claim, err error) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins = append(wins, win{i, cl.Fence})
			case !errors.Is(err, claim.ErrHeld) && !errors.Is(err, claim.ErrDone):
				fail = append(fail, fmt.Errorf("%s: %w", runs[i].ID(), err))
			}
		}
		for g, c := range clients {
			wg.Go(func() {
				if g%2 == 1 { // one claim at a time, from the last run down
					for i := n - 1; i >= 0; i-- {
						cl, err := claim.ClaimOne(t.Context(), c, runs[i], longLease)
						record(i, cl, err)
					}
					return
				}
				// Batches in different orders and sizes, overlapping.
				order := make([]int, n)
				for i := range order {
					order[i] = (i*(g+7) + g) % n
				}
				for len(order) > 0 {
					k := min(len(order), 16+g*8)
					part := make([]claim.Run, k)
					for j, i := range order[:k] {
						part[j] = runs[i]
					}
					cls, errs := c.Claim(t.Context(), part, longLease)
					for j, i := range order[:k] {
						record(i, cls[j], errs[j])
					}
					order = order[k:]
				}
			})
		}
		wg.Wait()
		for _, err := range fail {
			t.Error(err)
		}
		perRun := make([]int, n)
		var fences []int64
		for _, w := range wins {
			perRun[w.run]++
			fences = append(fences, w.fence)
		}
		for i, k := range perRun {
			if k != 1 {
				t.Fatalf("run %s had %d winners, want exactly 1", runs[i].ID(), k)
			}
		}
		slices.Sort(fences)
		if len(slices.Compact(slices.Clone(fences))) != len(fences) {
			t.Fatalf("runs of one job share a fence: %v", fences)
		}
		// Later grants of the job, batched or not, get higher fences.
		c := open("replica-late")
		later := mustClaim(t, c, runAt("job.batchrace", n), longLease)
		cls, errs := c.Claim(ctxT(t), []claim.Run{runAt("job.batchrace", n+1), runAt("job.batchrace", n+2)}, longLease)
		for i := range errs {
			if errs[i] != nil {
				t.Fatalf("late batch: %v", errs[i])
			}
		}
		last := fences[len(fences)-1]
		if later.Fence <= last || cls[0].Fence <= later.Fence || cls[1].Fence <= later.Fence || cls[0].Fence == cls[1].Fence {
			t.Fatalf("race's highest fence %d, then %d, then a batch's %d and %d: not strictly growing",
				last, later.Fence, cls[0].Fence, cls[1].Fence)
		}
	})
}

// sameRecord compares two reads of one run: the same facts, times equal
// as instants.
func sameRecord(a, b claim.Record) bool {
	return a.RunID == b.RunID && a.Job == b.Job && a.At.Equal(b.At) && a.Status == b.Status &&
		a.Holder == b.Holder && a.Fence == b.Fence && a.Attempt == b.Attempt &&
		a.StartedAt.Equal(b.StartedAt) && a.LeaseUntil.Equal(b.LeaseUntil) && a.FinishedAt.Equal(b.FinishedAt)
}
