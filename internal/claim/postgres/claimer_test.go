package postgres_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance runs the suite on a private, migrated schema per case,
// with one pool per claimer: separate clients, as separate replicas.
func TestConformance(t *testing.T) {
	claimtest.Run(t, backends.Factory("postgres", backends.Options{}), claimtest.Options{Prunes: true, StartHold: true})
}
