package backends_test

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestMain checks that what Open starts (pools, clients, private nodes) is
// gone once the tests that opened it end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestOpenEveryKindSharesOneNamespacePerCall(t *testing.T) {
	for _, kind := range backends.Kinds {
		t.Run(kind, func(t *testing.T) {
			open := backends.Open(t, kind)
			a, b := open("a"), open("b")
			run := claim.Run{Job: "backends.test", At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
			cl, err := a.Claim(t.Context(), run, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Claim(t.Context(), run, time.Minute); !errors.Is(err, claim.ErrHeld) {
				t.Fatalf("second client's claim: %v, want ErrHeld (one namespace per Open)", err)
			}
			if err := a.Release(t.Context(), cl, claim.Succeeded); err != nil {
				t.Fatal(err)
			}
			// Another Open is another namespace: the same run is fresh there.
			if _, err := backends.Open(t, kind)("c").Claim(t.Context(), run, time.Minute); err != nil {
				t.Fatalf("claim in a second namespace: %v", err)
			}
		})
	}
}
