package claim

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// runIDSeeds are job names that could confuse a key: separators, the
// delimiter itself, text that looks like an instant, unicode, length.
var runIDSeeds = []string{
	"billing.nightly", "a", "a:b", "run:x", "runs:x", "fence:x", "@", "a@b", "@@", "x@2026-01-02T03:04:05Z",
	"x@2026-01-02T03:04:05.5Z@", "Zürich/夜間", "\x00", "\xff\xfe", " ", strings.Repeat("j", 1000),
	strings.Repeat("@:", 500),
}

// FuzzRunID: Run.ID and ParseID are inverse for every job name and instant,
// so two distinct runs never share an id (and so a key); and ParseID never
// panics and always yields a run whose id parses back to itself.
func FuzzRunID(f *testing.F) {
	instants := []int64{0, 1, -1, 1_767_323_045_000_000_000, 1_767_323_045_500_000_000, 1_767_323_045_123_456_789,
		-6_795_364_578_871_345_152, 1<<63 - 1}
	for i, job := range runIDSeeds {
		other := runIDSeeds[(i+1)%len(runIDSeeds)]
		f.Add(job, instants[i%len(instants)], other, instants[(i+3)%len(instants)])
	}
	// The same instant in two jobs, the same job at two instants, and a job
	// whose name ends like another's id.
	f.Add("a", int64(1_767_323_045_000_000_000), "b", int64(1_767_323_045_000_000_000))
	f.Add("a", int64(1_767_323_045_000_000_000), "a", int64(1_767_323_045_000_000_001))
	f.Add("a@2026-01-02T03:04:05Z", int64(1_767_323_045_000_000_000), "a", int64(1_767_323_045_000_000_000))
	f.Fuzz(func(t *testing.T, job1 string, ns1 int64, job2 string, ns2 int64) {
		// A zone other than UTC must not change the id.
		r1 := Run{Job: job1, At: time.Unix(0, ns1).In(time.FixedZone("x", 5*3600+1800))}
		r2 := Run{Job: job2, At: time.Unix(0, ns2)}
		for _, r := range []Run{r1, r2} {
			id := r.ID()
			got, err := ParseID(id)
			if r.Job == "" {
				if err == nil {
					t.Fatalf("ParseID(%q) of an empty job = %+v, want an error", id, got)
				}
				continue
			}
			if err != nil {
				t.Fatalf("ParseID(%q): %v", id, err)
			}
			if got.Job != r.Job || !got.At.Equal(r.At) || got.At.Location() != time.UTC {
				t.Fatalf("ParseID(%q) = %q %v, want %q %v (UTC)", id, got.Job, got.At, r.Job, r.At.UTC())
			}
		}
		same := r1.Job == r2.Job && r1.At.Equal(r2.At)
		if (r1.ID() == r2.ID()) != same {
			t.Fatalf("runs %q@%d and %q@%d: ids %q and %q", job1, ns1, job2, ns2, r1.ID(), r2.ID())
		}
		// Arbitrary text: no panic, and what parses is canonical once
		// re-encoded.
		for _, s := range []string{job1, job2, job1 + "@" + job2} {
			if run, err := ParseID(s); err == nil {
				again, err := ParseID(run.ID())
				if err != nil || again.Job != run.Job || !again.At.Equal(run.At) {
					t.Fatalf("ParseID(%q) = %+v, whose id %q parses to %+v, %v", s, run, run.ID(), again, err)
				}
			}
		}
	})
}

func TestRunIDSeedsAreDistinct(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	seen := map[string]Run{}
	for _, job := range runIDSeeds {
		for _, d := range []time.Duration{0, time.Nanosecond, time.Second, -time.Hour} {
			r := Run{Job: job, At: at.Add(d)}
			if prev, ok := seen[r.ID()]; ok {
				t.Fatalf("%+v and %+v share id %q", prev, r, r.ID())
			}
			seen[r.ID()] = r
		}
	}
}

// TestCheckClaimBatch: each run gets CheckClaim's answer, and once ctx is
// done every run that passed gets ctx's error instead of a bid.
func TestCheckClaimBatch(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	runs := []Run{{Job: "a", At: at}, {Job: "", At: at}, {Job: "b", At: at}}
	errs, valid := CheckClaimBatch(context.Background(), runs, time.Second)
	if len(errs) != 3 || errs[0] != nil || !errors.Is(errs[1], ErrInvalid) || errs[2] != nil || !slices.Equal(valid, []int{0, 2}) {
		t.Fatalf("CheckClaimBatch = %v, %v; want the empty job invalid and runs 0, 2 valid", errs, valid)
	}
	if _, valid := CheckClaimBatch(context.Background(), runs, 0); len(valid) != 0 {
		t.Fatalf("CheckClaimBatch with a zero lease passed runs %v", valid)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs, valid = CheckClaimBatch(ctx, runs, time.Second)
	if len(valid) != 0 || !errors.Is(errs[0], context.Canceled) || !errors.Is(errs[1], ErrInvalid) {
		t.Fatalf("CheckClaimBatch after cancel = %v, %v; want context.Canceled for valid runs, ErrInvalid kept", errs, valid)
	}
}
