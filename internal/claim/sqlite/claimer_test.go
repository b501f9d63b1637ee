package sqlite_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance runs the suite on a fresh file per case, opened once per
// claimer: separate clients, as separate processes.
func TestConformance(t *testing.T) {
	claimtest.Run(t, backends.Factory("sqlite", backends.Options{}), claimtest.Options{
		Prunes: true,
		// Every commit fsyncs the WAL; on a shared disk under -race that
		// takes up to a few hundred ms, too close to the default 300ms lease
		// renewed every 100ms.
		Lease:     time.Second,
		StartHold: true,
	})
}
