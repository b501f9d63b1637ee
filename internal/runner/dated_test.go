package runner_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// Every claimer with a network between it and its store dates a grant and
// a renewal from when its request left (Requested), never from when the
// reply came back: the runner trusts a lease until Requested + lease −
// lease/10, and the backend started the lease when the request arrived,
// at least one link delay before the reply. Dated from the reply, a
// holder on a slow link would trust its lease past the backend's, and a
// takeover could run beside it. The explorer cannot see this (its harness
// dates requests itself), and on a fast link the two dates are the same
// instant, so here every link is slowed by d each way: whatever else it
// costs, the date must come before the reply's arrival less d.
func TestEveryClaimerDatesItsLeasesFromTheRequest(t *testing.T) {
	const d = 150 * time.Millisecond
	const lease = 30 * time.Second
	for _, kind := range append(slices.Clone(backends.Kinds), config.ClaimerEtcd) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			be := backends.Prepare(t, kind, backends.Options{Tune: func(c *config.Claimer) {
				// Above the link's round trip, by seconds (a stall of
				// this process on a busy machine is not the subject),
				// and below lease/10.
				c.Redlock.NodeTimeout = config.Duration(2500 * time.Millisecond)
			}})
			servers := be.Servers()
			if len(servers) == 0 {
				t.Skip("no network between the claimer and its store")
			}
			px := &proxies{}
			via := map[string]string{}
			for _, s := range servers {
				via[s] = px.proxy(t, phClaim, s)
			}
			c := be.OpenClient("slow", backends.Client{Via: via, MaxConns: 2})
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			// A first claim opens the client's connections at full speed.
			at := time.Now().UTC().Truncate(time.Second)
			warm, err := claim.ClaimOne(ctx, c, claim.Run{Job: "job.warm", At: at}, lease)
			if err != nil {
				t.Fatal(err)
			}
			if err := claim.ReleaseOne(ctx, c, warm, claim.Succeeded); err != nil {
				t.Fatal(err)
			}
			px.SetLatency(d)
			dated := func(what string, sent, cameBack time.Time, cl *claim.Claim) {
				t.Helper()
				if took := cameBack.Sub(sent); took < 2*d {
					t.Fatalf("%s took %v through links slowed by %v each way: the latency was not applied", what, took, d)
				}
				if latest := cameBack.Add(-d); !cl.Requested.Before(latest) || cl.Requested.Before(sent) {
					t.Errorf("%s sent at +0s came back at +%v and is dated +%v: want a date before +%v, when the request had arrived at the latest",
						what, cameBack.Sub(sent), cl.Requested.Sub(sent), latest.Sub(sent))
				}
			}
			sent := time.Now()
			cl, err := claim.ClaimOne(ctx, c, claim.Run{Job: "job.dated", At: at}, lease)
			if err != nil {
				t.Fatal(err)
			}
			dated("a grant", sent, time.Now(), cl)
			sent = time.Now()
			if err := c.Renew(ctx, cl, lease); err != nil {
				t.Fatal(err)
			}
			dated("a renewal", sent, time.Now(), cl)
			// A batch goes another way on some backends (postgres: one
			// multi-row insert).
			sent = time.Now()
			batch := []claim.Run{{Job: "job.batch", At: at}, {Job: "job.batch", At: at.Add(time.Second)}}
			cls, errs := c.Claim(ctx, batch, lease)
			cameBack := time.Now()
			for i := range batch {
				if errs[i] != nil {
					t.Fatal(errs[i])
				}
				dated("a batch's grant", sent, cameBack, cls[i])
			}
			if errs := c.Release(ctx, append(cls, cl), []claim.Status{claim.Succeeded, claim.Succeeded, claim.Succeeded}); errors.Join(errs...) != nil {
				t.Fatal(errs)
			}
		})
	}
}
