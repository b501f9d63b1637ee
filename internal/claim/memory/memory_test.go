package memory_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	claimtest.Run(t, func(t *testing.T) func(string) claim.Claimer {
		s := memory.NewStore(nil)
		return func(instance string) claim.Claimer { return memory.New(s, instance) }
	}, claimtest.Options{})
}
