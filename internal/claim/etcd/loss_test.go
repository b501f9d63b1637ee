package etcd_test

import (
	"errors"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestWipedClusterIsHeldForALease wipes every member of a cluster (SIGKILL,
// data directories removed, started anew with the same ids) while a
// replica holds a run. The other replica, which had seen the cluster's
// revisions before, must be told the cluster lost its data
// (claim.DataLossError riding along ErrHeld) and be refused the run until
// a lease after it noticed, by when the holder has stopped trusting its
// claim; then it is granted the run anew, attempt 1, with a fence below
// the holder's: the fences restarted lower. The holder's renewal is
// refused with the loss too.
func TestWipedClusterIsHeldForALease(t *testing.T) {
	cluster := testenv.StartEtcd(t, 3)
	ns := backends.Prepare(t, "etcd", backends.Options{Servers: cluster.Endpoints()})
	holder, other := ns.Open("replica-a"), ns.Open("replica-b")
	const lease = 6 * time.Second // measured by the holder; the guard must outlast it

	// Some history, so that revisions are well above a new cluster's.
	// The guard lasts the longest lease a claimer was asked for: every
	// claim here asks for the same.
	for i := range 20 {
		cl, err := claim.ClaimOne(ctxFor(t, 10*time.Second), holder, runAt(i), lease)
		if err == nil {
			err = claim.ReleaseOne(ctxFor(t, 10*time.Second), holder, cl, claim.Succeeded)
		}
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
	}
	run := claim.Run{Job: "job.loss", At: base}
	first, err := claim.ClaimOne(ctxFor(t, 10*time.Second), holder, run, lease)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := claim.ClaimOne(ctxFor(t, 10*time.Second), other, run, lease); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("claim of a held run before the wipe: %v, want ErrHeld", err)
	}

	if err := cluster.Wipe(ctxFor(t, 60*time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Logf("wiped the cluster; holder's fence was %d", first.Fence)

	// The first answer from the new cluster is the loss.
	var loss *claim.DataLossError
	var sentAt, answeredAt time.Time
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		sentAt = time.Now()
		cl, err := claim.ClaimOne(ctxFor(t, 2*time.Second), other, run, lease)
		answeredAt = time.Now()
		switch {
		case err == nil:
			t.Fatalf("granted %s after the wipe, fence %d attempt %d, while its holder (fence %d) still trusts its claim; want a DataLossError",
				run.ID(), cl.Fence, cl.Attempt, first.Fence)
		case errors.As(err, &loss) && errors.Is(err, claim.ErrHeld):
		case unavailable(err) && time.Now().Before(deadline):
			continue
		default:
			t.Fatalf("claim after the wipe: %v; want ErrHeld with a DataLossError", err)
		}
		break
	}
	t.Logf("told: %v", loss)
	if loss.Until.Before(sentAt.Add(lease)) || loss.Until.After(answeredAt.Add(lease)) {
		t.Fatalf("held until %s; want a lease (%v) after the loss was noticed, between %s and %s",
			loss.Until, lease, sentAt.Add(lease), answeredAt.Add(lease))
	}

	// The holder's claim is gone, and it is told why.
	err = holder.Renew(ctxFor(t, 10*time.Second), first, lease)
	var told *claim.DataLossError
	if !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("holder's renewal after the wipe: %v, want ErrLeaseLost", err)
	}
	if errors.As(err, &told) {
		t.Logf("holder told: %v", told)
	}

	// Held, with the same loss, until a lease after it was noticed.
	for time.Until(loss.Until) > 200*time.Millisecond {
		cl, err := claim.ClaimOne(ctxFor(t, 2*time.Second), other, run, lease)
		var again *claim.DataLossError
		switch {
		case err == nil:
			t.Fatalf("granted %s at %s, fence %d, before the guard ends at %s", run.ID(), time.Now(), cl.Fence, loss.Until)
		case unavailable(err):
		case !errors.As(err, &again) || !errors.Is(err, claim.ErrHeld):
			if time.Now().Before(loss.Until) {
				t.Fatalf("claim during the guard: %v; want ErrHeld with the DataLossError", err)
			}
		case !again.Until.Equal(loss.Until):
			t.Fatalf("the loss is told again held until %s, first until %s: it would be reported twice", again.Until, loss.Until)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Then granted anew on the cluster that forgot: attempt 1, fences lower.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		cl, err := claim.ClaimOne(ctxFor(t, 2*time.Second), other, run, lease)
		if err == nil {
			if !time.Now().After(loss.Until) {
				t.Fatalf("granted before the guard's end %s", loss.Until)
			}
			if cl.Attempt != 1 || cl.Fence >= first.Fence {
				t.Fatalf("granted after the guard: attempt %d fence %d; want attempt 1 below the lost fence %d",
					cl.Attempt, cl.Fence, first.Fence)
			}
			t.Logf("granted after the guard: fence %d (was %d)", cl.Fence, first.Fence)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not granted within 30s of the guard's end: %v", err)
		}
	}
	// The holder, which noticed later, is granted a fresh run once its
	// own guard has passed, and releases it.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		cl, err := claim.ClaimOne(ctxFor(t, 2*time.Second), holder, runAt(100), lease)
		if err == nil {
			if err := claim.ReleaseOne(ctxFor(t, 10*time.Second), holder, cl, claim.Succeeded); err != nil {
				t.Fatal(err)
			}
			break
		}
		var again *claim.DataLossError
		if told != nil && errors.As(err, &again) && !again.Until.Equal(told.Until) {
			t.Fatalf("the holder is told of the loss again, held until %s, first until %s", again.Until, told.Until)
		}
		if time.Now().After(deadline) {
			t.Fatalf("holder: fresh run not granted within 30s: %v", err)
		}
	}
}
