package explore

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/nemesis"
)

// TestRegressions pins, for each fault class the explorer found breaking a
// guarantee, a plan that broke it before the fix, and the invariant it
// broke. Each must now hold; run against the runner before the fix (commit
// c9cbb68), each failed with the invariant named here.
func TestRegressions(t *testing.T) {
	heavy(t)
	s := time.Second
	op := func(kind string, replica int, at, d time.Duration) nemesis.Op {
		return nemesis.Op{Kind: kind, Replica: replica, At: at, For: d}
	}
	cases := []struct {
		name     string
		replicas int
		seed     uint64
		ops      []nemesis.Op
		broke    string // what it broke before the fix
	}{{
		// Class 3: the release of a finished run never lands; the holder
		// gave up after a lease and reported success, then the run was
		// taken over and succeeded again.
		name: "OutageAsHandlersReturn", replicas: 3, seed: 3, broke: history.SucceededTwice,
		ops: []nemesis.Op{op(nemesis.Outage, -1, 12*s+250*time.Millisecond, 9*s)},
	}, {
		// Class 4: a one-replica deployment crashes mid-run and comes back
		// after the job's next instant: the interrupted run was never looked
		// at again (only the latest instant was).
		name: "OneReplicaBackAfterTheNextInstant", replicas: 1, seed: 4, broke: history.Abandoned,
		ops: []nemesis.Op{op(nemesis.Crash, 0, 17*s+800*time.Millisecond, 20*s)},
	}, {
		// Class 5: a handler that ignores its context returns nil after
		// shutdown_grace; the run was released as interrupted and run again.
		name: "StubbornHandlerPastShutdownGrace", replicas: 1, seed: 5, broke: history.HandedBackDone,
		ops: []nemesis.Op{op(nemesis.Term, 0, 3*s+50*time.Millisecond, s), op(nemesis.Term, 0, 9*s+50*time.Millisecond, s),
			op(nemesis.Term, 0, 15*s+50*time.Millisecond, s), op(nemesis.Term, 0, 21*s+50*time.Millisecond, s)},
	}, {
		// Class 7: a replica's clock jumps ahead by more than max_clock_skew:
		// it claimed and ran instants early, beside the previous instant's
		// run on another replica.
		name: "ClockJumpsAheadPastTheSkew", replicas: 3, seed: 7, broke: history.JobOverlap,
		ops: []nemesis.Op{{Kind: nemesis.Clock, Replica: 0, At: 5 * s, For: 20 * s, Shift: 3500 * time.Millisecond}},
	}, {
		// Class 8: overlap: forbid across replicas while a run is taken
		// over: replicas that restarted, or lost their lease while paused,
		// started the next instant beside the previous one's takeover.
		name: "ForbidAcrossTakeovers", replicas: 3, seed: 1, broke: history.JobOverlap,
		ops: nemesis.New(1, nemesis.Params{Replicas: 3, Lease: 3 * s, MaxSkew: s, From: 3 * s, To: 30 * s, Extra: 4,
			Classes: []string{nemesis.Crash, nemesis.Term, nemesis.Pause, nemesis.Partition, nemesis.OneWay, nemesis.Outage, nemesis.Latency, nemesis.Clock}}).Ops,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				res, err := Run(Config{Seed: tc.seed, Replicas: tc.replicas, Plan: &nemesis.Plan{Seed: tc.seed, Ops: tc.ops}})
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Violations) > 0 {
					t.Errorf("%d violations (this plan once broke %s)\n%s", len(res.Violations), tc.broke, res.Report())
				}
			})
		})
	}
}

// TestReplaceBesideALateTakeover: seeds the sweep failed once the harness
// stamped claims with the caller's send time, as a real client does. A
// replica whose clock ran ahead claimed the replace job's next instant
// early, over a slow link or a stalled store, so its estimate of the
// backend's clock ran ahead by the request's trip: it probed for earlier
// runs before its instant came on the store, and then started beside a
// takeover of the previous instant granted in between (job-overlap). The
// interleaving of replicas inside the bubble varies from run to run (the
// old runner failed each about one run in six), so each seed is replayed
// many times.
func TestReplaceBesideALateTakeover(t *testing.T) {
	heavy(t)
	for _, seed := range []uint64{1304, 1812} {
		for i := range 25 {
			t.Run(fmt.Sprintf("%d/%d", seed, i), func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) { explored(t, Config{Seed: seed, NoBackfills: true, NoHeres: true}) })
			})
		}
	}
}

// TestAGrantLandingAfterItsSendersRestartIsTakenOverWhilePaused pins seed
// 41429 (found by fresh seeds in stop 33): the backend stalls; a replica
// sends its claim of an instant of a job only it schedules then, crashes,
// and comes back while the operator has paused every job; the stall ends
// and the dead incarnation's claim is granted. Before the fix the new
// incarnation, seeing the job paused at start-up, did not contend for
// that instant at all, so nobody watched the grant's lease and the run was
// abandoned (history.Abandoned), in about half the runs of the seed (the
// explorer's goroutines interleave differently from run to run): hence
// eight runs here, which all passed before the fix one time in 256.
func TestAGrantLandingAfterItsSendersRestartIsTakenOverWhilePaused(t *testing.T) {
	replaySeed(t, Config{Seed: 41429, NoBackfills: true, NoHeres: true}, 8, false)
}

// replaySeed runs cfg's seed runs times (a seed found before backfills
// were explored replays without them: NoBackfills), each a subtest (in parallel with the
// others if parallel): the explorer's goroutines interleave differently
// from run to run, so a seed that broke a guarantee did so in some runs.
func replaySeed(t *testing.T, cfg Config, runs int, parallel bool) {
	heavy(t)
	for i := range runs {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if parallel {
				t.Parallel()
			}
			synctest.Test(t, func(t *testing.T) { explored(t, cfg) })
		})
	}
}

// TestAGrantWhoseReplyWasLostWhileRecordingMissedIsWatched pins seed 51737
// (found by fresh seeds in stop 33): a replica restarts after an instant of
// a job that only its own config schedules then (a mixed config) went by
// unclaimed, and start-up claims that instant to record it missed. The
// grant lands but its reply is lost (a one-way partition), and so is the
// reply of the retry, a takeover granted once the first lease lapsed, in a
// stalled backend; the next retry hears "held". Before the fix start-up
// took "held" for another replica's run and dropped it, though the holder
// was its own unanswered bid: nobody watched the lease, and the run was
// abandoned (history.Abandoned) in every run of the seed.
func TestAGrantWhoseReplyWasLostWhileRecordingMissedIsWatched(t *testing.T) {
	replaySeed(t, Config{Seed: 51737, NoBackfills: true, NoHeres: true}, 4, false)
}

// TestATakeoverBuriedBehindEndedRunsIsStillSeen pins seed 61163 (found by
// fresh seeds in stop 34): a buffer-one job's run is interrupted, taken
// over, and its holder crashes; during the outage that follows its lease
// lapses, and newer instants, which an expired run does not hold back,
// have run and ended by the time two replicas come back and one takes it
// over again (attempt 3). As more instants are recorded it sinks below the
// newest 16 records, behind runs that ended, where the overlap probe
// stopped reading: a newer run waiting for its turn lost sight of it and
// started beside it (history.JobOverlap), on the same replica or another,
// in about one run in thirteen. Now the probe counts the runs its replica
// executes, and reads deeper when its replica stands by for an earlier
// run the page does not reach; forty runs, which all passed before the
// fix about one time in twenty-three.
func TestATakeoverBuriedBehindEndedRunsIsStillSeen(t *testing.T) {
	replaySeed(t, Config{Seed: 61163, NoBackfills: true, NoHeres: true}, 40, true)
}

// TestAGrantThatLandedAfterItsHolderExitedIsAdopted pins seed 133110
// (fresh seeds 130,000–139,999, stop 35): a replica, paused and then
// terminated, bids for an instant only its version of tick names; the
// request waits in a stalled server's socket and lands, granted, after
// the incarnation exited and after its successor's start-up recovery had
// read the history. No replica's schedule names the instant, so nobody
// watched the grant, and the later instants' overlap probes skipped
// around it: abandoned in about three runs in five. Now a probe stands by
// for the live runs it finds that nobody on its replica watches.
func TestAGrantThatLandedAfterItsHolderExitedIsAdopted(t *testing.T) {
	replaySeed(t, Config{Seed: 133110, NoHeres: true, NoOnce: true}, 8, true)
}

// TestRunsRequestedAlongsideAreNeverSkippedForOverlap pins the seeds that
// found a run requested with --overlap allow skipped for overlap
// (history.AlongsideHeld), one per path that decided without the request:
// a retry on the replica that ran it (5971), a takeover by a replica that
// had not dispatched it (133), a replica that adopted its run before it
// had read the request (4750), and the skip decided while the requests
// could not be read (190145: 1 run in 1 failed before its fix; 193350:
// 1 in 12).
func TestRunsRequestedAlongsideAreNeverSkippedForOverlap(t *testing.T) {
	heavy(t)
	for _, seed := range []uint64{133, 4750, 5971, 190145, 193350} {
		for i := range 4 {
			t.Run(fmt.Sprintf("%d/%d", seed, i), func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) { explored(t, Config{Seed: seed, NoHeres: true, NoOnce: true}) })
			})
		}
	}
}

// TestABackfillOutwaitsItsOwnGrantFromAStalledServer pins seed 201206
// (fresh seeds 200,000–209,999, stop 37): a backfill's bid, sent while
// the backend stalled, was granted as the stall ended; its answer was
// lost. The backfill asks again until that lost grant could no longer
// hold the run, but counted that window from the bid's send: it closed
// while the grant still held it, the backfill reported the instant run
// "elsewhere", settled, and the run was left live for good (abandoned:
// 4 runs of the seed in 57 alone; 3 to 6 of these 40 in each of four
// tries). Now the window counts from the backend's next answer.
func TestABackfillOutwaitsItsOwnGrantFromAStalledServer(t *testing.T) {
	replaySeed(t, Config{Seed: 201206, NoHeres: true, NoOnce: true}, 40, true)
}
