package memory_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	claimtest.Run(t, backends.Factory("memory", backends.Options{}), claimtest.Options{})
}
