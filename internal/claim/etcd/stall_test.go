package etcd_test

import (
	"testing"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/claim/etcd"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// stoppable opens a holder and a standby on a private 3-member cluster,
// and returns functions that stop every member (SIGSTOP: a stalled
// cluster, as a host's freeze or a storage stall of all of them) and
// continue them.
func stoppable(t *testing.T) (holder, standby claim.Claimer, stop, cont func()) {
	t.Helper()
	cluster := testenv.StartEtcd(t, 3)
	ns := backends.Prepare(t, "etcd", backends.Options{Servers: cluster.Endpoints()})
	return ns.Open("holder"), ns.Open("standby"), func() {
			for _, m := range cluster.Members() {
				if err := m.Pause(); err != nil {
					t.Fatal(err)
				}
			}
		}, func() {
			for _, m := range cluster.Members() {
				if err := m.Resume(); err != nil {
					t.Fatal(err)
				}
			}
		}
}

// TestALeaseThatLapsedWhileTheMembersWereStoppedIsNotTakenOverAtOnce: the
// members stopped for longer than the lease
// (claimtest.LapsedInAStallIsNotTakenOver). As they resume, the leader
// revokes every lease that ran out meanwhile; a standby took a finished
// run over then, before its holder's retried release landed (the
// explorer with the members stopped: 2 of 12 seeds).
func TestALeaseThatLapsedWhileTheMembersWereStoppedIsNotTakenOverAtOnce(t *testing.T) {
	t.Parallel()
	holder, standby, stop, cont := stoppable(t)
	claimtest.LapsedInAStallIsNotTakenOver(t, holder, standby, stop, cont, testenv.EtcdLease)
}

// TestAClusterStoppedBrieflyAgainAndAgainHoldsTakeoversOnlyAWhile: brief
// stops every fraction of a lease, answers between them
// (claimtest.ChronicStallsEndTheHold).
func TestAClusterStoppedBrieflyAgainAndAgainHoldsTakeoversOnlyAWhile(t *testing.T) {
	t.Parallel()
	holder, standby, stop, cont := stoppable(t)
	claimtest.ChronicStallsEndTheHold(t, holder, standby, stop, cont, testenv.EtcdLease)
}

// TestABidSentIntoAStoppedClusterDoesNotTakeOverWhenItRuns: a standby's
// bid that waited out the stall, its tries running out one after another
// (claimtest.ABidThatWaitedInAStallIsHeld).
func TestABidSentIntoAStoppedClusterDoesNotTakeOverWhenItRuns(t *testing.T) {
	t.Parallel()
	holder, standby, stop, cont := stoppable(t)
	claimtest.ABidThatWaitedInAStallIsHeld(t, holder, standby, stop, cont, testenv.EtcdLease, 0)
}

// TestABatchBidSentIntoAStoppedClusterDoesNotTakeOverWhenItRuns: the
// same bid in a batch (claimtest.ABatchBidThatWaitedInAStallIsHeld).
func TestABatchBidSentIntoAStoppedClusterDoesNotTakeOverWhenItRuns(t *testing.T) {
	t.Parallel()
	holder, standby, stop, cont := stoppable(t)
	claimtest.ABatchBidThatWaitedInAStallIsHeld(t, holder, standby, stop, cont, testenv.EtcdLease, 0)
}

// TestAClaimWhoseReplyAndUndoWereLostIsGrantedToItsNextTry: the bid won,
// its reply was lost, and so was the undo (a stalled cluster answers
// neither). The grant is this replica's: its next claim of the run takes
// it at once, where it would be held off by its own ghost for a lease;
// another replica is still held off (claimtest.NextTryTakesItsLostGrant).
// The grant taken is fenced anew, and History shows it under the fence
// its holder heard.
func TestAClaimWhoseReplyAndUndoWereLostIsGrantedToItsNextTry(t *testing.T) {
	t.Parallel()
	run := claim.Run{Job: "job.unseen", At: base}
	lossy, other, fence := etcd.UnseenGrant(t, run)
	claimtest.NextTryTakesItsLostGrant(t, lossy, other, run)
	recs, err := other.History(t.Context(), run.Job, 0)
	if err != nil || len(recs) != 2 {
		t.Fatalf("history: %+v, %v; want the run and the grant of its job made since", recs, err)
	}
	if r := recs[1]; r.RunID != run.ID() || r.Fence <= fence || r.Attempt != 1 || r.Holder != "lossy" || r.Status != claim.Succeeded {
		t.Fatalf("history of %s: %+v; want it succeeded under lossy, attempt 1, fenced above the unseen grant's %d", run.ID(), r, fence)
	}
}
