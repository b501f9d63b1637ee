package backends_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestMain checks that what Open starts (pools, clients, private nodes) is
// gone once the tests that opened it end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.IgnoreRedisDialProbe) }

func TestOpenEveryKindSharesOneNamespacePerCall(t *testing.T) {
	for _, kind := range backends.Kinds {
		t.Run(kind, func(t *testing.T) {
			open := backends.Open(t, kind)
			a, b := open("a"), open("b")
			run := claim.Run{Job: "backends.test", At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
			cl, err := claim.ClaimOne(t.Context(), a, run, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := claim.ClaimOne(t.Context(), b, run, time.Minute); !errors.Is(err, claim.ErrHeld) {
				t.Fatalf("second client's claim: %v, want ErrHeld (one namespace per Open)", err)
			}
			if err := claim.ReleaseOne(t.Context(), a, cl, claim.Succeeded); err != nil {
				t.Fatal(err)
			}
			// Another Open is another namespace: the same run is fresh there.
			if _, err := claim.ClaimOne(t.Context(), backends.Open(t, kind)("c"), run, time.Minute); err != nil {
				t.Fatalf("claim in a second namespace: %v", err)
			}
		})
	}
}

// TestClientViaIsWhatTheClaimerDials sends every server of a namespace to a
// dead port: a claimer that still reached the real servers would claim.
func TestClientViaIsWhatTheClaimerDials(t *testing.T) {
	for _, kind := range []string{"postgres", "redis", "redlock"} {
		t.Run(kind, func(t *testing.T) {
			ns := backends.Prepare(t, kind, backends.Options{})
			dead := map[string]string{}
			for _, s := range ns.Servers() {
				dead[s] = "127.0.0.1:1"
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			run := claim.Run{Job: "backends.via", At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
			// The opener may find out (redis checks its server), or the
			// first claim.
			if c, err := ns.Dial("a", backends.Client{Via: dead, MaxConns: 1}); err == nil {
				_, err = claim.ClaimOne(ctx, c, run, time.Minute)
				if !errors.Is(err, claim.ErrUnavailable) {
					t.Fatalf("claim with every server behind a dead port: %v, want ErrUnavailable", err)
				}
			} else if !errors.Is(err, claim.ErrUnavailable) {
				t.Fatalf("open with every server behind a dead port: %v, want ErrUnavailable", err)
			}
			if _, err := claim.ClaimOne(ctx, ns.Open("b"), run, time.Minute); err != nil {
				t.Fatalf("claim dialling directly: %v", err)
			}
		})
	}
}
