// Package claimtest is the one conformance suite every Claimer passes. A
// backend's test builds a Factory and calls Run; new behaviour gets a case
// here, never a per-backend copy.
package claimtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
)

// Factory returns an opener for claimers that share one namespace (schema,
// key prefix, store) isolated from every other call of the Factory. Each
// opened claimer is a separate client, as a separate replica would have.
// The factory registers its own cleanup with t.
type Factory func(t *testing.T) (open func(instance string) *claimers.Backend)

// Options tune the suite for a backend.
type Options struct {
	// Lease is the short lease used by the expiry cases (default 300ms).
	Lease time.Duration
	// Runs is how many runs the race case contends for (default 1000).
	Runs int
	// Contenders is how many goroutines race per run (default 16).
	Contenders int
	// Clients is how many separate claimers the contenders share
	// (default 4).
	Clients int
	// Prunes says the backend keeps finished runs until pruned (the SQL
	// backends): its prune case fails, rather than skips, if the opener
	// offers no Pruner.
	Prunes bool
	// Pages says the backend's grants carry their job's page of records
	// (claim.Claim.Page): its page case checks them against History. A
	// backend not declared so must leave every page nil: the runner
	// trusts a page as read in the grant's own step.
	Pages bool
	// StartHold says the backend's claimers start with takeovers held
	// until the backend has answered them for a lease (claim.Settler):
	// its start-hold case checks it, and every other case settles the
	// claimers it opens, which stand for replicas up for a while.
	StartHold bool
}

func (o *Options) defaults() {
	if o.Lease == 0 {
		o.Lease = 300 * time.Millisecond
	}
	if o.Runs == 0 {
		o.Runs = 1000
	}
	if o.Contenders == 0 {
		o.Contenders = 16
	}
	if o.Clients == 0 {
		o.Clients = 4
	}
}

// longLease is long enough never to expire during a test.
const longLease = 10 * time.Minute

// waitFor bounds every wait on wall time. Generous: CI is a noisy 2-core box.
const waitFor = 15 * time.Second

var base = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

func runAt(job string, i int) claim.Run {
	return claim.Run{Job: job, At: base.Add(time.Duration(i) * time.Second)}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*waitFor)
	t.Cleanup(cancel)
	return ctx
}

func mustClaim(t *testing.T, c claim.Claimer, run claim.Run, lease time.Duration) *claim.Claim {
	t.Helper()
	cl, err := claim.ClaimOne(ctxT(t), c, run, lease)
	if err != nil {
		t.Fatalf("claim %s: %v", run.ID(), err)
	}
	return cl
}

func wantErr(t *testing.T, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want %v", what, err, target)
	}
}

// takeOver polls until c wins run (after the holder's lease expires) or the
// deadline passes. Every failed poll must be ErrHeld.
func takeOver(t *testing.T, c claim.Claimer, run claim.Run, lease time.Duration) *claim.Claim {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		cl, err := claim.ClaimOne(ctxT(t), c, run, lease)
		if err == nil {
			return cl
		}
		if !errors.Is(err, claim.ErrHeld) {
			t.Fatalf("takeover of %s: %v, want ErrHeld until the lease expires", run.ID(), err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("takeover of %s: still held after %v", run.ID(), waitFor)
		}
		time.Sleep(20 * time.Millisecond) // polling a backend-side lease; no event to wait on
	}
}

// Run exercises a Claimer implementation against the contract.
func Run(t *testing.T, newClaimers Factory, opts Options) {
	opts.defaults()
	if opts.StartHold {
		startHoldCase(t, newClaimers, opts.Lease)
		newClaimers = settled(newClaimers)
	}
	batchCases(t, newClaimers, opts)
	releaseBatchCases(t, newClaimers, opts)
	controlCases(t, newClaimers, opts)
	lease := opts.Lease

	t.Run("GivenUpClaimsLeaveNoGhosts", func(t *testing.T) {
		t.Parallel()
		GivenUpClaimsLeaveNoGhosts(t, newClaimers)
	})
	t.Run("GivenUpTakeoversLeaveNoGhosts", func(t *testing.T) {
		t.Parallel()
		GivenUpTakeoversLeaveNoGhosts(t, newClaimers, lease)
	})

	t.Run("ClaimCarriesRunHolderTokenFenceAttempt", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a := open("replica-a")
		run := claim.Run{Job: "billing.nightly", At: base.In(time.FixedZone("X", 3600))}
		cl := mustClaim(t, a, run, longLease)
		if cl.Run.Job != run.Job || !cl.Run.At.Equal(run.At) || cl.Run.At.Location() != time.UTC {
			t.Fatalf("claim run = %+v, want %s in UTC", cl.Run, run.ID())
		}
		if cl.Holder != "replica-a" || cl.Token == "" || cl.Fence <= 0 || cl.Attempt != 1 {
			t.Fatalf("claim = %+v, want holder replica-a, a token, fence > 0, attempt 1", cl)
		}
		if cl.Lease != longLease || cl.Requested.IsZero() || cl.Deadline.IsZero() {
			t.Fatalf("claim = %+v, want lease %v and Requested/Deadline set", cl, longLease)
		}
		if err := a.Ping(ctxT(t)); err != nil {
			t.Fatalf("ping: %v", err)
		}
	})

	t.Run("SecondClaimIsHeld", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("replica-a"), open("replica-b")
		run := runAt("job.held", 0)
		mustClaim(t, a, run, longLease)
		_, err := claim.ClaimOne(ctxT(t), b, run, longLease)
		wantErr(t, err, claim.ErrHeld, "second replica")
		_, err = claim.ClaimOne(ctxT(t), a, run, longLease)
		wantErr(t, err, claim.ErrHeld, "same replica again")
		// The same instant written in another zone is the same run.
		_, err = claim.ClaimOne(ctxT(t), b, claim.Run{Job: run.Job, At: run.At.In(time.FixedZone("Y", -7200))}, longLease)
		wantErr(t, err, claim.ErrHeld, "same instant in another zone")
		// Another instant, or another job at the same instant, is another run.
		mustClaim(t, b, runAt("job.held", 1), longLease)
		mustClaim(t, b, runAt("job.held.other", 0), longLease)
	})

	t.Run("ConcurrentClaimsOneWinner", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		clients := make([]claim.Claimer, opts.Clients)
		for i := range clients {
			clients[i] = open(fmt.Sprintf("replica-%d", i))
		}
		wins := make([]atomic.Int32, opts.Runs)
		fences := make([]atomic.Int64, opts.Runs)
		var wg sync.WaitGroup
		errs := make(chan error, opts.Contenders)
		for g := range opts.Contenders {
			wg.Go(func() {
				c := clients[g%len(clients)]
				for i := range opts.Runs {
					run := runAt("job.race", i)
					cl, err := claim.ClaimOne(t.Context(), c, run, longLease)
					switch {
					case err == nil:
						wins[i].Add(1)
						fences[i].Store(cl.Fence)
						// Release half the runs as done: losers then see ErrDone.
						if i%2 == 1 {
							if err := claim.ReleaseOne(t.Context(), c, cl, claim.Succeeded); err != nil {
								errs <- fmt.Errorf("release %s: %w", run.ID(), err)
								return
							}
						}
					case errors.Is(err, claim.ErrHeld) || errors.Is(err, claim.ErrDone):
					default:
						errs <- fmt.Errorf("contender %d, %s: %w", g, run.ID(), err)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		seen := map[int64]int{}
		for i := range wins {
			if n := wins[i].Load(); n != 1 {
				t.Fatalf("run %d had %d winners, want exactly 1", i, n)
			}
			f := fences[i].Load()
			if j, dup := seen[f]; dup {
				t.Fatalf("runs %d and %d of one job share fence %d", j, i, f)
			}
			seen[f] = i
		}
	})

	t.Run("OnlyTheWinnersTokenRenewsOrReleases", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("replica-a"), open("replica-b")
		run := runAt("job.token", 0)
		cl := mustClaim(t, a, run, longLease)
		forged := *cl
		forged.Token = claim.NewToken()
		forged.Holder = "replica-b"
		wantErr(t, b.Renew(ctxT(t), &forged, longLease), claim.ErrLeaseLost, "renew with another token")
		wantErr(t, claim.ReleaseOne(ctxT(t), b, &forged, claim.Succeeded), claim.ErrLeaseLost, "release with another token")
		wantErr(t, claim.ReleaseOne(ctxT(t), b, &forged, claim.Interrupted), claim.ErrLeaseLost, "interrupt with another token")
		// The real holder is untouched by the forgeries. Its renewal dates
		// the lease anew from when it was sent: the runner times the next
		// renewal, and its trust in the lease, from Requested.
		before := time.Now()
		if err := a.Renew(ctxT(t), cl, longLease); err != nil {
			t.Fatalf("renew by holder: %v", err)
		}
		if cl.Requested.Before(before) || cl.Requested.After(time.Now()) {
			t.Fatalf("renewal sent between %v and now left Requested at %v", before, cl.Requested)
		}
		_, err := claim.ClaimOne(ctxT(t), b, run, longLease)
		wantErr(t, err, claim.ErrHeld, "claim after forged release")
		if err := claim.ReleaseOne(ctxT(t), a, cl, claim.Succeeded); err != nil {
			t.Fatalf("release by holder: %v", err)
		}
		// A retry of a release whose reply was lost succeeds and changes
		// nothing; no other outcome can overwrite it.
		if err := claim.ReleaseOne(ctxT(t), a, cl, claim.Succeeded); err != nil {
			t.Fatalf("repeated release (a retry after a lost reply): %v", err)
		}
		wantErr(t, claim.ReleaseOne(ctxT(t), a, cl, claim.Failed), claim.ErrLeaseLost, "release as failed after succeeded")
		wantErr(t, claim.ReleaseOne(ctxT(t), a, cl, claim.Interrupted), claim.ErrLeaseLost, "interrupt after succeeded")
		wantErr(t, a.Renew(ctxT(t), cl, longLease), claim.ErrLeaseLost, "renew after release")
		_, err = claim.ClaimOne(ctxT(t), b, run, longLease)
		wantErr(t, err, claim.ErrDone, "claim after repeated release")
	})

	t.Run("RenewKeepsTheClaimPastItsFirstLease", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("replica-a"), open("replica-b")
		// Renew at lease/3 for three leases; the run must stay held. A
		// lease counts from when the backend runs the request, which is
		// after it was sent: a renewal (or claim) sent less than a lease
		// before a call returns still held the run when the call ran. When
		// this process stalled for longer (a loaded CI host), a lost lease
		// proves nothing, and the case starts over on a new run.
		renewed := func(run claim.Run) (stalled bool) {
			sent := time.Now()
			cl := mustClaim(t, a, run, lease)
			for end := time.Now().Add(3 * lease); time.Now().Before(end); {
				time.Sleep(lease / 3) // the renewal cadence under test
				renewSent := time.Now()
				if err := a.Renew(ctxT(t), cl, lease); err != nil {
					if time.Since(sent) >= lease {
						return true
					}
					t.Fatalf("renew %v after the last grant or renewal was sent: %v", time.Since(sent), err)
				}
				sent = renewSent
				_, err := claim.ClaimOne(ctxT(t), b, run, lease)
				if err == nil && time.Since(sent) >= lease {
					return true
				}
				wantErr(t, err, claim.ErrHeld, "claim while renewed")
			}
			if cl.Lease != lease {
				t.Fatalf("renewed claim lease = %v, want %v", cl.Lease, lease)
			}
			return false
		}
		for try := 0; renewed(runAt("job.renew", try)); try++ {
			if try == 4 {
				t.Fatalf("the test process stalled for a whole %v lease in each of %d tries", lease, try+1)
			}
			t.Logf("try %d: the test process stalled for a whole %v lease; starting over", try, lease)
		}
	})

	// A lease counts from when the backend ran the request, which is after
	// it was sent: the deadline the backend sets is never before the
	// request's time + the lease. A backend whose clock has coarser steps
	// than the lease's precision must round the deadline up, not down:
	// the Redis script and SQLite's statement dated it from the start of
	// the millisecond they ran in, up to a millisecond early, and the
	// explorer saw a takeover come that much before the holder's request
	// + lease. (The backends here share this machine's clock.)
	t.Run("ALeaseEndsNoEarlierThanItsRequestPlusItsLease", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a := open("replica-a")
		early := func(what string, cl *claim.Claim) {
			t.Helper()
			if want := cl.Requested.Round(0).Add(cl.Lease); cl.Deadline.Before(want) {
				t.Errorf("%s %s: the backend's deadline %s is %v before its request + lease",
					what, cl.ID(), cl.Deadline.UTC().Format(time.RFC3339Nano), want.Sub(cl.Deadline))
			}
		}
		for i := range 40 {
			cl := mustClaim(t, a, runAt("job.deadline", i), longLease)
			early("grant of", cl)
			if err := a.Renew(ctxT(t), cl, longLease); err != nil {
				t.Fatalf("renew: %v", err)
			}
			early("renewal of", cl)
		}
	})

	t.Run("ExpiredLeaseIsTakenOverWithHigherFenceAndAttempt", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("replica-a"), open("replica-b")
		run := runAt("job.expire", 0)
		first := mustClaim(t, a, run, lease)
		second := takeOver(t, b, run, longLease)
		if second.Attempt != 2 || second.Fence <= first.Fence || second.Holder != "replica-b" {
			t.Fatalf("takeover = attempt %d fence %d holder %s; want attempt 2, fence > %d, holder replica-b",
				second.Attempt, second.Fence, second.Holder, first.Fence)
		}
		if second.Token == first.Token {
			t.Fatal("takeover reused the first token")
		}
		// The stale holder can neither renew nor release any more.
		wantErr(t, a.Renew(ctxT(t), first, longLease), claim.ErrLeaseLost, "renew after takeover")
		wantErr(t, claim.ReleaseOne(ctxT(t), a, first, claim.Succeeded), claim.ErrLeaseLost, "release after takeover")
		// And the successor still holds it.
		_, err := claim.ClaimOne(ctxT(t), a, run, longLease)
		wantErr(t, err, claim.ErrHeld, "claim by stale holder")
		if err := claim.ReleaseOne(ctxT(t), b, second, claim.Succeeded); err != nil {
			t.Fatalf("release by successor: %v", err)
		}
	})

	// Retries rest on this: a failed attempt renews its claim for the
	// backoff, shorter than the lease it held, and stops; once that
	// lapses the run is taken over as the next attempt, and not before.
	t.Run("RenewCanShortenALeaseThatThenLapsesToATakeover", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("replica-a"), open("replica-b")
		run := runAt("job.retry", 0)
		first := mustClaim(t, a, run, longLease)
		if err := a.Renew(ctxT(t), first, lease); err != nil {
			t.Fatalf("renew for a shorter lease: %v", err)
		}
		second, err := claim.ClaimOne(ctxT(t), b, run, longLease)
		switch {
		case err == nil:
			// The shortened lease lapsed before this bid (a loaded
			// machine): this grant is the takeover, checked below.
		case errors.Is(err, claim.ErrHeld):
			second = takeOver(t, b, run, longLease) // fails after waitFor if the long lease still held
		default:
			t.Fatalf("claim during the shortened lease: %v, want ErrHeld", err)
		}
		if second.Attempt != 2 || second.Fence <= first.Fence {
			t.Fatalf("after the shortened lease: attempt %d fence %d, want attempt 2 and a fence above %d",
				second.Attempt, second.Fence, first.Fence)
		}
		if err := claim.ReleaseOne(ctxT(t), b, second, claim.Succeeded); err != nil {
			t.Fatalf("release by the next attempt: %v", err)
		}
	})

	t.Run("RenewAfterExpiryIsLeaseLost", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a := open("replica-a")
		cl := mustClaim(t, a, runAt("job.lateRenew", 0), lease)
		time.Sleep(2 * lease) // the case is about a renewal that comes too late
		wantErr(t, a.Renew(ctxT(t), cl, lease), claim.ErrLeaseLost, "renew after expiry")
	})

	t.Run("DoneRunsAreNeverGrantedAgain", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("replica-a"), open("replica-b")
		for i, o := range []claim.Status{claim.Succeeded, claim.Failed, claim.Skipped, claim.Missed} {
			run := runAt("job.done", i)
			cl := mustClaim(t, a, run, lease)
			if err := claim.ReleaseOne(ctxT(t), a, cl, o); err != nil {
				t.Fatalf("release %s: %v", o, err)
			}
			_, err := claim.ClaimOne(ctxT(t), b, run, lease)
			wantErr(t, err, claim.ErrDone, "claim after "+string(o))
			_, err = claim.ClaimOne(ctxT(t), a, run, lease)
			wantErr(t, err, claim.ErrDone, "holder's claim after "+string(o))
		}
		// Still done after the lease would have expired.
		time.Sleep(lease + lease/2) // the case is about outliving the lease
		_, err := claim.ClaimOne(ctxT(t), b, runAt("job.done", 0), lease)
		wantErr(t, err, claim.ErrDone, "claim of a done run after its lease")
	})

	t.Run("InterruptedRunIsReclaimableAtOnce", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("replica-a"), open("replica-b")
		run := runAt("job.interrupt", 0)
		first := mustClaim(t, a, run, longLease)
		if err := claim.ReleaseOne(ctxT(t), a, first, claim.Interrupted); err != nil {
			t.Fatalf("release interrupted: %v", err)
		}
		if err := claim.ReleaseOne(ctxT(t), a, first, claim.Interrupted); err != nil {
			t.Fatalf("repeated interrupt before a takeover: %v", err)
		}
		second := mustClaim(t, b, run, longLease) // no wait for the lease
		if second.Attempt != 2 || second.Fence <= first.Fence {
			t.Fatalf("reclaim = attempt %d fence %d; want attempt 2, fence > %d", second.Attempt, second.Fence, first.Fence)
		}
		wantErr(t, claim.ReleaseOne(ctxT(t), a, first, claim.Interrupted), claim.ErrLeaseLost, "repeated interrupt after a takeover")
		wantErr(t, a.Renew(ctxT(t), first, longLease), claim.ErrLeaseLost, "renew of interrupted claim")
		if err := claim.ReleaseOne(ctxT(t), b, second, claim.Interrupted); err != nil {
			t.Fatalf("second interrupt: %v", err)
		}
		third := mustClaim(t, a, run, longLease)
		if third.Attempt != 3 || third.Fence <= second.Fence {
			t.Fatalf("third grant = attempt %d fence %d; want attempt 3, fence > %d", third.Attempt, third.Fence, second.Fence)
		}
	})

	t.Run("FencesGrowStrictlyOverEveryGrantOfAJob", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("replica-a"), open("replica-b")
		var last int64
		check := func(cl *claim.Claim) {
			t.Helper()
			if cl.Fence <= last {
				t.Fatalf("fence %d after %d: not strictly growing", cl.Fence, last)
			}
			last = cl.Fence
		}
		for i := range 10 {
			c, other := a, b
			if i%2 == 1 {
				c, other = b, a
			}
			run := runAt("job.fence", i)
			cl := mustClaim(t, c, run, longLease)
			check(cl)
			// Interleave another job: its grants must not disturb this one's order.
			mustClaim(t, other, runAt("job.fence.other", i), longLease)
			if err := claim.ReleaseOne(ctxT(t), c, cl, claim.Interrupted); err != nil {
				t.Fatalf("interrupt: %v", err)
			}
			again := mustClaim(t, other, run, longLease)
			check(again)
			if err := claim.ReleaseOne(ctxT(t), other, again, claim.Succeeded); err != nil {
				t.Fatalf("release: %v", err)
			}
		}
	})

	t.Run("BadInputIsRejected", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a := open("replica-a")
		cases := []struct {
			name  string
			run   claim.Run
			lease time.Duration
		}{
			{"EmptyJob", claim.Run{At: base}, longLease},
			{"ZeroInstant", claim.Run{Job: "job.bad"}, longLease},
			{"ZeroLease", runAt("job.bad", 0), 0},
			{"NegativeLease", runAt("job.bad", 0), -time.Second},
		}
		for _, tc := range cases {
			_, err := claim.ClaimOne(ctxT(t), a, tc.run, tc.lease)
			wantErr(t, err, claim.ErrInvalid, tc.name)
		}
		cl := mustClaim(t, a, runAt("job.bad", 1), longLease)
		wantErr(t, a.Renew(ctxT(t), cl, 0), claim.ErrInvalid, "renew with zero lease")
		wantErr(t, claim.ReleaseOne(ctxT(t), a, cl, claim.Status("maybe")), claim.ErrInvalid, "unknown outcome")
		wantErr(t, a.Renew(ctxT(t), nil, longLease), claim.ErrInvalid, "renew nil claim")
		wantErr(t, claim.ReleaseOne(ctxT(t), a, nil, claim.Succeeded), claim.ErrInvalid, "release nil claim")
	})

	t.Run("CancelledContextReturnsPromptly", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a := open("replica-a")
		held := mustClaim(t, a, runAt("job.cancel", 0), longLease)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		start := time.Now()
		_, err := claim.ClaimOne(ctx, a, runAt("job.cancel", 1), longLease)
		if !errors.Is(err, context.Canceled) || errors.Is(err, claim.ErrHeld) {
			t.Fatalf("claim with cancelled ctx: %v, want context.Canceled and not ErrHeld", err)
		}
		if err := a.Renew(ctx, held, longLease); !errors.Is(err, context.Canceled) {
			t.Fatalf("renew with cancelled ctx: %v, want context.Canceled", err)
		}
		if err := claim.ReleaseOne(ctx, a, held, claim.Succeeded); !errors.Is(err, context.Canceled) {
			t.Fatalf("release with cancelled ctx: %v, want context.Canceled", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("cancelled calls took %v", d)
		}
		// Nothing was granted or released under the cancelled context.
		if err := a.Renew(ctxT(t), held, longLease); err != nil {
			t.Fatalf("claim released by a cancelled call: %v", err)
		}
	})

	t.Run("AGrantsPageIsItsJobsHistoryAsOfTheGrant", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("replica-a"), open("replica-b")
		const job = "job.page"
		// checkPage compares cl's page with the job's history read right
		// after the grant (nothing else writes the job meanwhile).
		checkPage := func(cl *claim.Claim) {
			t.Helper()
			if !opts.Pages {
				if cl.Page != nil {
					t.Fatalf("grant of %s carries a page (%d records), but the backend is not declared to give them", cl.ID(), len(cl.Page))
				}
				return
			}
			recs, err := a.History(ctxT(t), job, claim.PageSize)
			if err != nil {
				t.Fatalf("history: %v", err)
			}
			if !sameRecords(cl.Page, recs) {
				t.Fatalf("grant of %s: page\n%+v\nwant the history read after it\n%+v", cl.ID(), cl.Page, recs)
			}
			if cl.Page[0].RunID != cl.ID() || cl.Page[0].Fence != cl.Fence || cl.Page[0].Status != claim.Running {
				t.Fatalf("grant of %s (fence %d): page starts with %+v, want the grant's own record", cl.ID(), cl.Fence, cl.Page[0])
			}
		}
		// Asked for (claim.WithPages), or none.
		ctx := claim.WithPages(ctxT(t))
		claimPaged := func(c claim.Claimer, run claim.Run, lease time.Duration) *claim.Claim {
			t.Helper()
			cl, err := claim.ClaimOne(ctx, c, run, lease)
			if err != nil {
				t.Fatalf("claim %s: %v", run.ID(), err)
			}
			return cl
		}
		if cl := mustClaim(t, a, runAt(job+".unasked", 0), longLease); cl.Page != nil {
			t.Fatalf("a grant not asked for its page carries one: %+v", cl.Page)
		}
		checkPage(claimPaged(a, runAt(job, 0), longLease))
		// A page deeper than PageSize: finished, failed and live runs of
		// two holders, then a fresh grant among them.
		for i := 1; i <= claim.PageSize+2; i++ {
			c := a
			if i%3 == 0 {
				c = b
			}
			cl := claimPaged(c, runAt(job, i), longLease)
			checkPage(cl)
			if i%4 != 0 {
				out := claim.Succeeded
				if i%5 == 0 {
					out = claim.Failed
				}
				if err := claim.ReleaseOne(ctxT(t), c, cl, out); err != nil {
					t.Fatal(err)
				}
			}
		}
		// A takeover's page names the new grant.
		run := runAt(job, claim.PageSize+3)
		claimPaged(a, run, lease)
		deadline := time.Now().Add(waitFor)
		for {
			cl, err := claim.ClaimOne(ctx, b, run, longLease)
			if err == nil {
				checkPage(cl)
				break
			}
			if !errors.Is(err, claim.ErrHeld) || time.Now().After(deadline) {
				t.Fatalf("takeover of %s: %v", run.ID(), err)
			}
			time.Sleep(20 * time.Millisecond) // polling a backend-side lease; no event to wait on
		}
	})

	t.Run("HistoryRecordsEveryGrantAndOutcome", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a := open("replica-a")
		h := a
		ok1 := mustClaim(t, a, runAt("job.hist", 0), longLease)
		if err := claim.ReleaseOne(ctxT(t), a, ok1, claim.Succeeded); err != nil {
			t.Fatal(err)
		}
		bad := mustClaim(t, a, runAt("job.hist", 1), longLease)
		if err := claim.ReleaseOne(ctxT(t), a, bad, claim.Failed); err != nil {
			t.Fatal(err)
		}
		live := mustClaim(t, a, runAt("job.hist", 2), longLease)
		mustClaim(t, a, runAt("job.hist.other", 0), longLease)
		recs, err := h.History(ctxT(t), "job.hist", 10)
		if err != nil {
			t.Fatalf("history: %v", err)
		}
		if len(recs) != 3 {
			t.Fatalf("history has %d records, want 3: %+v", len(recs), recs)
		}
		want := []claim.Status{claim.Running, claim.Failed, claim.Succeeded}
		for i, r := range recs {
			if r.Status != want[i] || r.Job != "job.hist" || r.Holder != "replica-a" || r.Attempt != 1 {
				t.Fatalf("record %d = %+v, want status %s by replica-a", i, r, want[i])
			}
			if r.RunID != runAt("job.hist", 2-i).ID() || !r.At.Equal(runAt("job.hist", 2-i).At) {
				t.Fatalf("record %d is %s, want newest first", i, r.RunID)
			}
		}
		if recs[0].Fence != live.Fence || recs[0].StartedAt.IsZero() || !recs[2].FinishedAt.After(time.Time{}) {
			t.Fatalf("records lack fence or times: %+v", recs)
		}
		all, err := h.History(ctxT(t), "", 2)
		if err != nil || len(all) != 2 {
			t.Fatalf("history of all jobs, limit 2: %d records, %v", len(all), err)
		}
	})

	t.Run("PruneForgetsOnlyFinishedRunsPastRetention", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		c := open("replica-a")
		p := c.Pruner
		switch {
		case p == nil && opts.Prunes:
			t.Fatal("the opener offers no Pruner for a backend that keeps finished runs")
		case p == nil:
			t.Skip("the backend expires finished runs by itself")
		}
		h := c
		var live *claim.Claim
		for i, o := range []claim.Status{claim.Succeeded, claim.Failed, claim.Skipped, claim.Interrupted, ""} {
			cl := mustClaim(t, c, runAt("job.prune", i), longLease)
			if o == "" {
				live = cl
				continue
			}
			if err := claim.ReleaseOne(ctxT(t), c, cl, o); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := p.Prune(ctxT(t), time.Hour); err != nil || n != 0 {
			t.Fatalf("prune older than 1h = %d, %v; want 0 (nothing is that old)", n, err)
		}
		// A backend clock with millisecond resolution needs a tick before
		// the releases are older than "now".
		var pruned int64
		for deadline := time.Now().Add(waitFor); pruned < 3 && time.Now().Before(deadline); {
			n, err := p.Prune(ctxT(t), 0)
			if err != nil {
				t.Fatal(err)
			}
			pruned += n
		}
		if pruned != 3 {
			t.Fatalf("prune older than 0 deleted %d runs, want the 3 finished ones", pruned)
		}
		recs, err := h.History(ctxT(t), "job.prune", 0)
		if err != nil || len(recs) != 2 {
			t.Fatalf("history after prune = %+v, %v; want the interrupted and the running run", recs, err)
		}
		if err := c.Renew(ctxT(t), live, longLease); err != nil {
			t.Fatalf("live claim after prune: %v", err)
		}
		if _, err := p.Prune(ctxT(t), -time.Second); !errors.Is(err, claim.ErrInvalid) {
			t.Fatalf("negative retention: %v, want ErrInvalid", err)
		}
	})
}

// sameRecords reports whether a and b list the same records, times
// compared as instants.
func sameRecords(a, b []claim.Record) bool {
	return slices.EqualFunc(a, b, func(x, y claim.Record) bool {
		return x.RunID == y.RunID && x.Job == y.Job && x.At.Equal(y.At) && x.Status == y.Status && x.Holder == y.Holder &&
			x.Fence == y.Fence && x.Attempt == y.Attempt && x.StartedAt.Equal(y.StartedAt) &&
			x.LeaseUntil.Equal(y.LeaseUntil) && x.FinishedAt.Equal(y.FinishedAt)
	})
}
