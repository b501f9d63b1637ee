package history

import (
	"slices"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// builder writes a history by hand, one event a millisecond apart unless
// told otherwise.
type builder struct {
	t0  time.Time
	now time.Time
	evs []Event
}

func newBuilder() *builder {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return &builder{t0: t0, now: t0}
}

func (b *builder) at(d time.Duration) *builder { b.now = b.t0.Add(d); return b }

func (b *builder) add(e Event) *builder {
	e.At, e.Seq = b.now, len(b.evs)+1
	b.evs = append(b.evs, e)
	b.now = b.now.Add(time.Millisecond)
	return b
}

var (
	runA  = claim.Run{Job: "j", At: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	runA2 = claim.Run{Job: "j", At: time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC)}
	runA3 = claim.Run{Job: "j", At: time.Date(2026, 1, 1, 0, 0, 2, 0, time.UTC)}
)

const lease = time.Second

// grant is a claim granted to replica with token tok, its request sent
// just before.
func (b *builder) grant(replica, tok string, run claim.Run, fence int64, attempt int) *builder {
	return b.add(Event{Kind: Grant, Replica: replica, Run: run, Token: tok, Fence: fence, Attempt: attempt,
		Sent: b.now.Add(-time.Millisecond), Until: b.now.Add(-time.Millisecond + lease)})
}

func (b *builder) event(kind Kind, replica, tok string, run claim.Run, f func(*Event)) *builder {
	e := Event{Kind: kind, Replica: replica, Run: run, Token: tok}
	if f != nil {
		f(&e)
	}
	return b.add(e)
}

// finish is a handler that ran and returned nil, then a release accepted.
func (b *builder) finish(replica, tok string, run claim.Run, o claim.Status) *builder {
	b.event(Start, replica, tok, run, nil)
	b.event(Return, replica, tok, run, func(e *Event) { e.Status = claim.Succeeded })
	b.event(Release, replica, tok, run, func(e *Event) { e.Status = o; e.Sent = b.now })
	return b.event(End, replica, tok, run, func(e *Event) { e.Status = o })
}

func invariants(vs []Violation) []string {
	var out []string
	for _, v := range vs {
		if !slices.Contains(out, v.Invariant) {
			out = append(out, v.Invariant)
		}
	}
	return out
}

func TestCheckFindsEachViolation(t *testing.T) {
	forbid := Spec{Forbid: map[string]bool{"j": true}}
	tests := []struct {
		name  string
		build func(b *builder)
		spec  Spec
		want  []string
	}{{
		name: "CleanHistory",
		build: func(b *builder) {
			b.grant("r1", "a", runA, 1, 1).finish("r1", "a", runA, claim.Succeeded)
			b.event(Skip, "r2", "", runA, func(e *Event) { e.Reason = "done" })
			b.at(2*time.Second).grant("r2", "b", runA2, 2, 1).finish("r2", "b", runA2, claim.Succeeded)
		},
		spec: Spec{Forbid: forbid.Forbid, Expected: []claim.Run{runA, runA2}, Settled: time.Date(2026, 1, 1, 0, 0, 5, 0, time.UTC)},
	}, {
		name: "GrantedWhileTheHolderTrustsItsLease",
		build: func(b *builder) {
			b.grant("r1", "a", runA, 1, 1)
			b.event(Start, "r1", "a", runA, nil)
			b.at(500*time.Millisecond).grant("r2", "b", runA, 2, 2)
			b.event(Start, "r2", "b", runA, nil)
			b.at(700*time.Millisecond).event(Down, "r3", "", claim.Run{}, nil) // the history goes on
		},
		want: []string{GrantOverlap, RunOverlap},
	}, {
		name: "TakenOverAfterTheLeaseLapsed",
		build: func(b *builder) {
			b.grant("r1", "a", runA, 1, 1).event(Start, "r1", "a", runA, nil)
			b.at(1500*time.Millisecond).grant("r2", "b", runA, 2, 2).finish("r2", "b", runA, claim.Succeeded)
		},
	}, {
		// The handler ran on 300ms past its lease (granted at 0, a 1s
		// lease, never renewed): judged where MustStop says it had to
		// stop, and not where it says the handler may run on (one that
		// ignores its cancellation, a replica frozen meanwhile).
		name: "HandlerRanPastItsLease",
		build: func(b *builder) {
			b.grant("r1", "a", runA, 1, 1).event(Start, "r1", "a", runA, nil)
			b.at(1300*time.Millisecond).event(Return, "r1", "a", runA, func(e *Event) { e.Status = claim.Succeeded })
		},
		spec: Spec{MustStop: func(string, string, time.Time, time.Time) bool { return true }},
		want: []string{Overran},
	}, {
		name: "HandlerMayRunPastItsLease",
		build: func(b *builder) {
			b.grant("r1", "a", runA, 1, 1).event(Start, "r1", "a", runA, nil)
			b.at(1300*time.Millisecond).event(Return, "r1", "a", runA, func(e *Event) { e.Status = claim.Succeeded })
		},
		spec: Spec{MustStop: func(string, string, time.Time, time.Time) bool { return false }},
	}, {
		name: "HandlerRanPastItsLeaseWithinTheSlack",
		build: func(b *builder) {
			b.grant("r1", "a", runA, 1, 1).event(Start, "r1", "a", runA, nil)
			b.at(1300*time.Millisecond).event(Return, "r1", "a", runA, func(e *Event) { e.Status = claim.Succeeded })
		},
		spec: Spec{MustStop: func(string, string, time.Time, time.Time) bool { return true }, OverrunSlack: 500 * time.Millisecond},
	}, {
		name: "TwoSuccesses",
		build: func(b *builder) {
			b.grant("r1", "a", runA, 1, 1).finish("r1", "a", runA, claim.Succeeded)
			b.event(End, "r2", "x", runA, func(e *Event) { e.Status = "succeeded" })
		},
		want: []string{SucceededTwice},
	}, {
		name: "FenceGoesBack",
		build: func(b *builder) {
			b.grant("r1", "a", runA, 5, 1).finish("r1", "a", runA, claim.Succeeded)
			b.grant("r2", "b", runA2, 3, 1).finish("r2", "b", runA2, claim.Succeeded)
		},
		want: []string{FenceOrder},
	}, {
		name: "ForbiddenJobOverlaps",
		build: func(b *builder) {
			b.grant("r1", "a", runA, 1, 1).event(Start, "r1", "a", runA, nil)
			b.grant("r2", "b", runA2, 2, 1).event(Start, "r2", "b", runA2, nil)
			b.at(700*time.Millisecond).event(Down, "r3", "", claim.Run{}, nil) // the history goes on
		},
		spec: forbid,
		want: []string{JobOverlap},
	}, {
		name: "ARunRequestedAlongsideOverlaps", // --overlap allow
		build: func(b *builder) {
			b.grant("r1", "a", runA, 1, 1).event(Start, "r1", "a", runA, nil)
			b.grant("r2", "b", runA2, 2, 1).event(Start, "r2", "b", runA2, nil)
			b.at(700*time.Millisecond).event(Down, "r3", "", claim.Run{}, nil) // the history goes on
		},
		spec: Spec{Forbid: forbid.Forbid, Alongside: map[string]bool{runA2.ID(): true}},
	}, {
		name: "ARunRequestedAlongsideSkippedForOverlap",
		build: func(b *builder) {
			b.grant("r1", "a", runA, 1, 1).event(Start, "r1", "a", runA, nil)
			b.grant("r2", "b", runA2, 2, 1).event(Skip, "r2", "b", runA2, func(e *Event) { e.Reason = "overlap" })
		},
		spec: Spec{Alongside: map[string]bool{runA2.ID(): true}},
		want: []string{AlongsideHeld},
	}, {
		name: "LostAndAbandoned",
		build: func(b *builder) {
			b.grant("r1", "a", runA, 1, 1).event(Start, "r1", "a", runA, nil).event(Crash, "r1", "", claim.Run{}, nil)
		},
		spec: Spec{Expected: []claim.Run{runA, runA2}, Settled: time.Date(2026, 1, 1, 0, 0, 5, 0, time.UTC)},
		want: []string{Abandoned, Lost},
	}, {
		name: "TakeoverSkippedAsMisfire",
		build: func(b *builder) {
			b.grant("r2", "b", runA, 2, 2)
			b.event(Skip, "r2", "b", runA, func(e *Event) { e.Reason = "missed"; e.Attempt = 2 })
		},
		want: []string{TakeoverMisfire},
	}, {
		name: "FinishedWorkHandedBack",
		build: func(b *builder) {
			b.grant("r1", "a", runA, 1, 1).event(Start, "r1", "a", runA, nil)
			b.event(Return, "r1", "a", runA, func(e *Event) { e.Status = claim.Succeeded })
			b.event(Release, "r1", "a", runA, func(e *Event) { e.Status = claim.Interrupted; e.Sent = b.now })
		},
		want: []string{HandedBackDone},
	}, {
		// r1's handler returned nil at 100ms, inside its lease; its
		// release was refused (the run taken over), and r2 ran the run
		// again at 1.2s. Judged unless a fault excuses it, or r1 crashed.
		name:  "DoneInsideItsLeaseRunAgain",
		build: redoneAfter(nil),
		spec:  Spec{Excused: func(_, _ Event, _, crashed time.Time) bool { return !crashed.IsZero() }},
		want:  []string{Redone},
	}, {
		name:  "DoneInsideItsLeaseRunAgainUnderAFault",
		build: redoneAfter(nil),
		spec:  Spec{Excused: func(Event, Event, time.Time, time.Time) bool { return true }},
	}, {
		name: "DoneInsideItsLeaseRunAgainAfterTheHolderCrashed",
		build: redoneAfter(func(b *builder) {
			b.at(300*time.Millisecond).event(Crash, "r1", "", claim.Run{}, nil)
		}),
		spec: Spec{Excused: func(_, _ Event, _, crashed time.Time) bool { return !crashed.IsZero() }},
	}, {
		// r1's run succeeded and its release landed; then the backend lost
		// it (a server gone back to an older copy of its data), and r2 ran
		// the run again. The second success and release follow from the
		// rerun: judged once, by the excuse, or reported with it.
		name:  "DoneAndReleasedThenRunAgain",
		build: releasedThenRunAgain,
		spec:  Spec{Excused: func(_, _ Event, _, crashed time.Time) bool { return !crashed.IsZero() }},
		want:  []string{Redone, SucceededTwice, ReleasedTwice},
	}, {
		name:  "DoneAndReleasedThenRunAgainUnderAFault",
		build: releasedThenRunAgain,
		spec:  Spec{Excused: func(Event, Event, time.Time, time.Time) bool { return true }},
	}, {
		// r1's grant of runA was lost with the backend's data at 500ms;
		// r2 started runA2 of the same forbid job then, while r1 ran on
		// until its renewal told it, and r3's grant of runA2 was lost
		// too, its holder gone with it.
		name:  "BesideAGrantTheBackendForgot",
		build: besideAForgottenGrant,
		spec: Spec{Forbid: forbid.Forbid, Settled: time.Date(2026, 1, 1, 0, 0, 5, 0, time.UTC),
			Forgotten: func(g Event) (time.Time, time.Time, bool) {
				t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
				return t0.Add(500 * time.Millisecond), t0.Add(1500 * time.Millisecond), g.Token != "b"
			}},
	}, {
		name:  "BesideAGrantTheBackendKept",
		build: besideAForgottenGrant,
		spec:  Spec{Forbid: forbid.Forbid, Settled: time.Date(2026, 1, 1, 0, 0, 5, 0, time.UTC)},
		want:  []string{JobOverlap, Abandoned},
	}, {
		// r1's release of runA landed; the backend lost it, and r2 was
		// granted runA afresh and skipped it (paused).
		name:  "ReleasedThenReleasedAgain",
		build: releasedThenReleasedAgain,
		want:  []string{ReleasedTwice},
	}, {
		name:  "ReleasedThenReleasedAgainAfterTheBackendLostIt",
		build: releasedThenReleasedAgain,
		spec:  Spec{Unwritten: func(rel Event) bool { return rel.Token == "a" }},
	}, {
		// r1 finished runA at 3ms; runA2 falls due at 1s and r2 skips it
		// for overlap at 1.2s: nothing of the job was live from 800ms on.
		name:  "SkippedForOverlapWithNothingLive",
		build: skippedForOverlap(nil),
		spec:  Spec{Forbid: forbid.Forbid, OverlapSlack: 200 * time.Millisecond},
		want:  []string{SkippedIdle},
	}, {
		name:  "SkippedForOverlapWithNothingLiveUnjudged", // no slack given
		build: skippedForOverlap(nil),
		spec:  Spec{Forbid: forbid.Forbid},
	}, {
		name:  "SkippedForOverlapOfAJobThatAllowsIt", // not the runner's skip to judge
		build: skippedForOverlap(nil),
		spec:  Spec{OverlapSlack: 200 * time.Millisecond},
	}, {
		// runA's release landed at 850ms, within the slack before runA2's
		// instant: r2's clock may run that far ahead.
		name: "SkippedForOverlapOfARunThatEndedWithinTheSlack",
		build: skippedForOverlap(func(b *builder) {
			b.at(850*time.Millisecond).event(Release, "r1", "a", runA, func(e *Event) { e.Status = claim.Succeeded; e.Sent = b.now })
		}),
		spec: Spec{Forbid: forbid.Forbid, OverlapSlack: 200 * time.Millisecond},
	}, {
		// runA's release landed at once, but its reply was lost: r1 sent
		// it again and settled the run only at 1.1s. Until then runA
		// executed on r1, as its runner counts it.
		name: "SkippedForOverlapOfARunItsHolderSettledLate",
		build: skippedForOverlap(func(b *builder) {
			b.event(Release, "r1", "a", runA, func(e *Event) { e.Status = claim.Succeeded; e.Sent = b.now })
			b.at(1100*time.Millisecond).event(End, "r1", "a", runA, func(e *Event) { e.Status = claim.Succeeded })
		}),
		spec: Spec{Forbid: forbid.Forbid, OverlapSlack: 200 * time.Millisecond},
	}, {
		// runA ended at once; r3 holds runA3 from 1.1s, while r2 decides.
		name: "SkippedForOverlapOfALiveRun",
		build: skippedForOverlap(func(b *builder) {
			b.event(Release, "r1", "a", runA, func(e *Event) { e.Status = claim.Succeeded; e.Sent = b.now })
			b.at(1100*time.Millisecond).grant("r3", "c", runA3, 3, 1)
		}),
		spec: Spec{Forbid: forbid.Forbid, OverlapSlack: 200 * time.Millisecond},
	}, {
		// runA ended at once; r3's claim of runA3, sent at 1.05s, went
		// unanswered at 1.15s: the backend may have granted it unseen,
		// a lease long (r3's next try would be given that grant).
		name: "SkippedForOverlapOfARunAClaimLeftUnanswered",
		build: skippedForOverlap(func(b *builder) {
			b.event(Release, "r1", "a", runA, func(e *Event) { e.Status = claim.Succeeded; e.Sent = b.now })
			b.at(1150*time.Millisecond).event(Unanswered, "r3", "", runA3, func(e *Event) {
				e.Sent, e.Until = b.t0.Add(1050*time.Millisecond), b.now.Add(time.Second)
			})
		}),
		spec: Spec{Forbid: forbid.Forbid, OverlapSlack: 200 * time.Millisecond},
	}, {
		// The same unanswered claim, at 0.1s: any grant it made lapsed by
		// 0.2s, before runA2's instant less the slack.
		name: "SkippedForOverlapLongAfterAClaimLeftUnanswered",
		build: skippedForOverlap(func(b *builder) {
			b.event(Release, "r1", "a", runA, func(e *Event) { e.Status = claim.Succeeded; e.Sent = b.now })
			b.at(100*time.Millisecond).event(Unanswered, "r3", "", runA3, func(e *Event) {
				e.Sent, e.Until = b.t0.Add(50*time.Millisecond), b.now.Add(100*time.Millisecond)
			})
		}),
		spec: Spec{Forbid: forbid.Forbid, OverlapSlack: 200 * time.Millisecond},
		want: []string{SkippedIdle},
	}, {
		// runA's release landed at 3ms, and the backend lost it (a server
		// gone back to an older copy): its record is live again.
		name:  "SkippedForOverlapOfARunWhoseReleaseTheBackendLost",
		build: skippedForOverlap(nil),
		spec: Spec{Forbid: forbid.Forbid, OverlapSlack: 200 * time.Millisecond,
			Unwritten: func(rel Event) bool { return rel.Run == runA }},
	}, {
		name: "DoneOnlyAfterItsLeaseRunAgain", // a stubborn handler, cut at its lease
		build: func(b *builder) {
			b.grant("r1", "a", runA, 1, 1).event(Start, "r1", "a", runA, nil)
			b.at(1100*time.Millisecond).event(Return, "r1", "a", runA, func(e *Event) { e.Status = claim.Succeeded })
			b.at(1200*time.Millisecond).grant("r2", "b", runA, 2, 2).finish("r2", "b", runA, claim.Succeeded)
		},
		spec: Spec{Excused: func(_, _ Event, _, crashed time.Time) bool { return !crashed.IsZero() }},
	}, {
		// r2's grant came before r1's, but r2 started only after its lease
		// could have ended (paused between grant and start): a stale
		// holder's execution, which fencing stops, not the fleet's.
		name: "AStaleHolderStartsPastItsLease",
		build: func(b *builder) {
			b.grant("r2", "b", runA, 1, 1)
			b.at(1500*time.Millisecond).grant("r1", "a", runA, 2, 2).finish("r1", "a", runA, claim.Succeeded)
			b.at(1600*time.Millisecond).event(Start, "r2", "b", runA, nil)
			b.event(Return, "r2", "b", runA, func(e *Event) { e.Status = claim.Interrupted })
		},
		spec: Spec{Excused: func(_, _ Event, _, crashed time.Time) bool { return !crashed.IsZero() }},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBuilder()
			tt.build(b)
			vs := Check(b.evs, tt.spec)
			got := invariants(vs)
			slices.Sort(got)
			want := slices.Clone(tt.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				for _, v := range vs {
					t.Log(v.Format(b.t0))
				}
				t.Errorf("violations %v, want %v", got, want)
			}
		})
	}
}

// skippedForOverlap writes r1 finishing runA at once (a released, or,
// when between writes its release, only let go), between, then r2
// granted runA2 (due at 1s) at 1.2s and skipping it for overlap.
func skippedForOverlap(between func(b *builder)) func(b *builder) {
	return func(b *builder) {
		b.grant("r1", "a", runA, 1, 1)
		if between == nil {
			b.finish("r1", "a", runA, claim.Succeeded)
		} else {
			b.event(Start, "r1", "a", runA, nil)
			b.event(Return, "r1", "a", runA, func(e *Event) { e.Status = claim.Succeeded })
			between(b)
		}
		b.at(1200*time.Millisecond).grant("r2", "b", runA2, 5, 1)
		b.event(Skip, "r2", "b", runA2, func(e *Event) { e.Reason = "overlap"; e.Attempt = 1 })
		b.event(Release, "r2", "b", runA2, func(e *Event) { e.Status = claim.Skipped; e.Sent = b.now })
	}
}

// besideAForgottenGrant writes r1 running runA from 0 to 900ms, r2
// running runA2 of the same job from 600ms, and r3 granted runA3 and
// never heard of again.
func besideAForgottenGrant(b *builder) {
	b.grant("r1", "a", runA, 1, 1).event(Start, "r1", "a", runA, nil)
	b.at(600*time.Millisecond).grant("r2", "b", runA2, 2, 1).event(Start, "r2", "b", runA2, nil)
	b.at(900*time.Millisecond).event(Return, "r1", "a", runA, func(e *Event) { e.Status = claim.Interrupted })
	b.event(End, "r1", "a", runA, func(e *Event) { e.Status = claim.LeaseLost })
	b.at(950*time.Millisecond).event(Return, "r2", "b", runA2, func(e *Event) { e.Status = claim.Succeeded })
	b.event(Release, "r2", "b", runA2, func(e *Event) { e.Status = claim.Succeeded; e.Sent = b.now })
	b.event(End, "r2", "b", runA2, func(e *Event) { e.Status = claim.Succeeded })
	b.at(time.Second).grant("r3", "c", runA3, 3, 1)
}

// releasedThenReleasedAgain writes a run that r1 ran and released
// succeeded, and that r2 was granted afresh after and released skipped.
func releasedThenReleasedAgain(b *builder) {
	b.grant("r1", "a", runA, 1, 1)
	b.at(100*time.Millisecond).finish("r1", "a", runA, claim.Succeeded)
	b.at(1200*time.Millisecond).grant("r2", "b", runA, 2, 1)
	b.event(Release, "r2", "b", runA, func(e *Event) { e.Status = claim.Skipped; e.Sent = b.now })
}

// releasedThenRunAgain writes a run that r1 ran and released succeeded,
// and that r2 was granted and ran again after.
func releasedThenRunAgain(b *builder) {
	b.grant("r1", "a", runA, 1, 1)
	b.at(100*time.Millisecond).finish("r1", "a", runA, claim.Succeeded)
	b.at(1200*time.Millisecond).grant("r2", "b", runA, 2, 2).finish("r2", "b", runA, claim.Succeeded)
}

// redoneAfter writes a run whose handler on r1 returned nil inside its
// lease, whose release was refused, and which r2 took over and ran again
// once the lease lapsed; between adds events before the takeover.
func redoneAfter(between func(b *builder)) func(b *builder) {
	return func(b *builder) {
		b.grant("r1", "a", runA, 1, 1).event(Start, "r1", "a", runA, nil)
		b.at(100*time.Millisecond).event(Return, "r1", "a", runA, func(e *Event) { e.Status = claim.Succeeded })
		b.event(End, "r1", "a", runA, func(e *Event) { e.Status = "lease_lost" })
		if between != nil {
			between(b)
		}
		b.at(1200*time.Millisecond).grant("r2", "b", runA, 2, 2).finish("r2", "b", runA, claim.Succeeded)
	}
}

// Under two versions of a schedule (a rolling deploy), a scheduled run
// started at an instant neither names is unscheduled; manual runs, and
// instants either version names, are not.
func TestUnscheduledRunsUnderMixedSchedules(t *testing.T) {
	even := func(r claim.Run) bool { return r.At.Second()%2 == 0 }
	thirds := func(r claim.Run) bool { return r.At.Second()%3 == 0 }
	spec := Spec{Scheduled: func(r claim.Run) bool { return even(r) || thirds(r) }}
	at := func(s int) claim.Run { return claim.Run{Job: "j", At: runA.At.Add(time.Duration(s) * time.Second)} }
	manual := claim.Run{Job: "j", At: at(1).At.Add(time.Microsecond)}
	b := newBuilder()
	for i, run := range []claim.Run{at(2), at(3), at(6), manual, at(7)} {
		tok := string(rune('a' + i))
		b.grant("r1", tok, run, int64(i+1), 1).finish("r1", tok, run, claim.Succeeded)
	}
	vs := Check(b.evs, spec)
	if len(vs) != 1 || vs[0].Invariant != Unscheduled || vs[0].Run != at(7).ID() {
		t.Fatalf("violations %v; want one unscheduled, of %s", vs, at(7).ID())
	}
}
