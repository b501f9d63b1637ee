package control_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/control"
)

// The later of a job's own switch and the one for every job governs it.
func TestThePauseThatGovernsAJobIsTheLater(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	st := control.New(memory.NewStore(nil).Controls(), func() time.Time { return now })
	set := func(job string, paused bool) {
		t.Helper()
		now = now.Add(time.Second)
		if _, err := st.SetPause(ctx, control.Pause{Job: job, Paused: paused, By: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	paused := func(job string) bool {
		t.Helper()
		ps, err := st.Pauses(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ps.Paused(job)
	}
	if paused("a") {
		t.Fatal("paused before any switch")
	}
	set(control.AllJobs, true)
	if !paused("a") || !paused("b") {
		t.Fatal("pause --all does not pause every job")
	}
	set("a", false)
	if paused("a") || !paused("b") {
		t.Fatal("resume a after pause --all: want a running, b paused")
	}
	set(control.AllJobs, false)
	set("b", true)
	if paused("a") || !paused("b") {
		t.Fatal("resume --all then pause b: want a running, b paused")
	}
	// An older switch written late (a skewed operator's clock) loses.
	if p, err := st.SetPause(ctx, control.Pause{Job: "b", Paused: false, At: now.Add(-time.Hour)}); err != nil || !p.Paused {
		t.Fatalf("an older resume won: %+v %v", p, err)
	}
}

// A request made again under its id learns of the first, even from a
// clock behind; the run ids of requests never name a scheduled instant or
// a backfill's rerun.
func TestRequestsAreIdempotentAndNeverNameAScheduledInstant(t *testing.T) {
	ctx := context.Background()
	reg := memory.NewStore(nil).Controls()
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC) // a whole second
	first, isNew, err := control.New(reg, func() time.Time { return at }).Request(ctx, control.Request{ID: "r", Job: "j"})
	if err != nil || !isNew {
		t.Fatalf("first: %v %t", err, isNew)
	}
	if ns := first.At.Nanosecond(); ns < int(time.Microsecond) {
		t.Fatalf("manual instant %s is within a microsecond of a whole second", first.At)
	}
	if !control.Manual(first.Run()) {
		t.Fatal("a requested run is not Manual")
	}
	behind := control.New(reg, func() time.Time { return at.Add(-time.Minute) })
	again, isNew, err := behind.Request(ctx, control.Request{ID: "r", Job: "j"})
	if err != nil || isNew || again.Run().ID() != first.Run().ID() {
		t.Fatalf("retry from behind: %+v %t %v; want the first request", again, isNew, err)
	}
	// Another request at the same clock reading (another host, a coarse
	// clock) gets a run of its own.
	other, isNew, err := control.New(reg, func() time.Time { return at }).Request(ctx, control.Request{ID: "s", Job: "j"})
	if err != nil || !isNew || other.Run().ID() == first.Run().ID() || !control.Manual(other.Run()) {
		t.Fatalf("second request at the same reading: %+v %t %v; want a run of its own", other, isNew, err)
	}
	reqs, err := behind.Requests(ctx)
	if err != nil || len(reqs) != 2 {
		t.Fatalf("requests: %d %v", len(reqs), err)
	}
	if control.Manual(claim.Run{Job: "j", At: at}) {
		t.Fatal("a whole second counts as manual")
	}
}

// The schedule entries come with the pauses and requests in one snapshot,
// one per job: the latest write, whatever order the writes land in.
func TestDriftEntriesComeWithTheSnapshot(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	st := control.New(memory.NewStore(nil).Controls(), func() time.Time { return now })
	put := func(fp, by string, at time.Time) control.ScheduleEntry {
		t.Helper()
		got, err := st.SetSchedule(ctx, control.ScheduleEntry{Job: "j", Fingerprint: fp, Spec: "@every 2s", Timezone: "UTC", By: by, At: at})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	put("aaaa", "a", now)
	if got := put("bbbb", "b", now.Add(-time.Second)); got.Fingerprint != "aaaa" {
		t.Fatalf("an older write (a clock behind) replaced the entry: %+v", got)
	}
	put("cccc", "c", now.Add(time.Second))
	if _, err := st.SetPause(ctx, control.Pause{Job: "j", Paused: true, By: "t"}); err != nil {
		t.Fatal(err)
	}
	snap, err := st.Snapshot(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if e := snap.Schedules["j"]; len(snap.Schedules) != 1 || e.Fingerprint != "cccc" || e.By != "c" || !snap.Pauses.Paused("j") {
		t.Fatalf("snapshot %+v; want the pause and c's entry", snap)
	}
	if _, err := st.SetSchedule(ctx, control.ScheduleEntry{}); !errors.Is(err, claim.ErrInvalid) {
		t.Fatalf("an entry without a job: %v, want ErrInvalid", err)
	}
}

// listCounter counts the entries each List hands back (Snapshot lists
// concurrently).
type listCounter struct {
	claim.Controls
	listed atomic.Int64
}

func (l *listCounter) List(ctx context.Context, prefix string) ([]claim.Control, error) {
	cs, err := l.Controls.List(ctx, prefix)
	l.listed.Add(int64(len(cs)))
	return cs, err
}

// A replica's tick reads what it honours, never the week of failed
// attempts or reserved instants the register also keeps: a flapping job
// must not make every tick of every replica heavier.
func TestSnapshotReadsOnlyWhatATickHonours(t *testing.T) {
	ctx := context.Background()
	reg := &listCounter{Controls: memory.NewStore(nil).Controls()}
	st := control.New(reg, nil)
	if _, err := st.SetPause(ctx, control.Pause{Job: "a", Paused: true, By: "t"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Request(ctx, control.Request{Job: "a", By: "t"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Revoke(ctx, "a@2026-12-01T00:00:00Z", "a@2026-12-01T00:01:00Z", "r1", time.Hour); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if err := st.RecordAttempt(ctx, control.Attempt{RunID: "a@2026-12-01T00:00:00Z", Attempt: i + 1, Status: claim.Failed}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		if _, err := st.SetSchedule(ctx, control.ScheduleEntry{Job: fmt.Sprintf("j%d", i), Fingerprint: "f"}); err != nil {
			t.Fatal(err)
		}
	}
	reg.listed.Store(0)
	snap, err := st.Snapshot(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Pauses.Paused("a") || len(snap.Requests) != 1 || len(snap.Revoked) != 1 || snap.Schedules != nil {
		t.Fatalf("snapshot = %+v, want the pause, the request and the revocation, and no schedule entries", snap)
	}
	if n := reg.listed.Load(); n != 3 {
		t.Errorf("the tick read %d entries, want the 3 it honours (not the attempts, the reserved instant, nor the schedule entries)", n)
	}
	// Every few ticks, the schedule entries too.
	reg.listed.Store(0)
	if snap, err = st.Snapshot(ctx, true); err != nil || len(snap.Schedules) != 50 {
		t.Fatalf("snapshot with the schedule entries: %d of them, %v; want 50", len(snap.Schedules), err)
	}
	if n := reg.listed.Load(); n != 53 {
		t.Errorf("the tick with schedule entries read %d entries, want 53", n)
	}
}

// The members are the replicas whose announcement has not expired, on the
// backend's clock; a renewal keeps a replica in even when the writer's
// clock stepped back, and the tick's snapshot brings the same list.
func TestMembersAreTheReplicasWhoseAnnouncementIsLiveUntilTheyLeave(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	st := control.New(memory.NewStore(clock).Controls(), clock)
	announce := func(in string, ttl time.Duration) {
		t.Helper()
		if err := st.Announce(ctx, in, ttl); err != nil {
			t.Fatal(err)
		}
	}
	members := func(want ...string) {
		t.Helper()
		got, err := st.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		snap, err := st.Snapshot(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) || !slices.Equal(snap.Members, want) {
			t.Fatalf("members %q, in the snapshot %q, want %q", got, snap.Members, want)
		}
	}
	members()
	announce("replica-b", 5*time.Second)
	announce("replica-a", 5*time.Second)
	announce("replica-c", time.Second)
	members("replica-a", "replica-b", "replica-c")
	now = now.Add(2 * time.Second)
	members("replica-a", "replica-b")
	// replica-a's clock steps back an hour: its renewal still replaces its
	// entry, so it stays past the first announcement's expiry.
	now = now.Add(-time.Hour)
	announce("replica-a", time.Hour+5*time.Second)
	now = now.Add(time.Hour + 4*time.Second)
	members("replica-a")
	// replica-a stops, its clock stepped back again: it leaves at once,
	// not when its entry would have expired, and an announcement brings
	// it back. (The memory store's clock steps back with it, so the
	// entries of b and c, expired an hour on, are live again.)
	now = now.Add(-time.Hour)
	members("replica-a", "replica-b", "replica-c")
	if err := st.Leave(ctx, "replica-a"); err != nil {
		t.Fatal(err)
	}
	members("replica-b", "replica-c")
	announce("replica-a", 5*time.Second)
	members("replica-a", "replica-b", "replica-c")
}

// A run a process carries outside the schedule is in the tick's snapshot
// while its holder renews the entry, marked ended once it ended there
// (a renewal sent before that, landing after, does not bring it back),
// and gone when its entry expired: a killed holder's run is named for
// as long as the entry's ttl, no longer.
func TestUnwatchedRunsAreNamedWhileCarriedAndMarkedWhenEnded(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	reg := memory.NewStore(clock).Controls()
	holder := control.New(reg, clock)
	unwatched := func() []control.Unwatched {
		t.Helper()
		snap, err := control.New(reg, clock).Snapshot(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		return snap.Unwatched
	}
	old := control.Unwatched{Job: "report", At: now.Add(-30 * 24 * time.Hour), Holder: "cli"}
	killed := control.Unwatched{Job: "report", At: now.Add(-29 * 24 * time.Hour), Holder: "cli"}
	for _, u := range []control.Unwatched{old, killed} {
		if err := holder.Carry(ctx, u, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if got := unwatched(); len(got) != 2 || got[0].Ends || got[1].Ends || !got[0].At.Equal(old.At) || got[0].Holder != "cli" {
		t.Fatalf("carried: %+v, want both runs, neither ended", got)
	}
	// old's run ends; a renewal written before, from a clock a second
	// behind (a write that raced the end), lands after it.
	now = now.Add(4 * time.Second)
	if err := holder.Ended(ctx, old, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := control.New(reg, func() time.Time { return now.Add(-time.Second) }).Carry(ctx, old, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	got := unwatched()
	if len(got) != 2 || !got[0].Ends || got[1].Ends {
		t.Fatalf("after the end of the first: %+v, want it marked ended and the other carried", got)
	}
	// killed's holder renews no more: its entry is named until it expires.
	now = now.Add(7 * time.Second)
	if got := unwatched(); len(got) != 1 || !got[0].Ends {
		t.Fatalf("11s after the last renewal of the killed holder's run: %+v, want only the ended one (it expires 14s in)", got)
	}
	now = now.Add(4 * time.Second)
	if got := unwatched(); len(got) != 0 {
		t.Fatalf("%+v, want every entry expired", got)
	}
	if err := holder.Carry(ctx, control.Unwatched{Job: "report"}, time.Second); !errors.Is(err, claim.ErrInvalid) {
		t.Errorf("a run without an instant: %v, want ErrInvalid", err)
	}
}
