package memory_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	claimtest.Run(t, backends.Factory("memory", backends.Options{}), claimtest.Options{})
}

// TestConformanceWithPages runs the suite over a store whose grants carry
// their job's page (Store.GrantPages), as the explorer's odd seeds use it.
func TestConformanceWithPages(t *testing.T) {
	claimtest.Run(t, func(t *testing.T) func(string) *claimers.Backend {
		s := memory.NewStore(nil)
		s.GrantPages()
		return func(instance string) *claimers.Backend {
			return &claimers.Backend{Claimer: memory.New(s, instance), Kind: config.ClaimerMemory, Controls: s.Controls()}
		}
	}, claimtest.Options{Pages: true})
}
