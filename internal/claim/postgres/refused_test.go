package postgres_test

import (
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestRefusedWritesHoldTakeoversUntilWritesLand: while the server refuses
// every write (a full disk: SQLSTATE 53100, raised here by a trigger on
// every row written, as a server out of space refuses each write that
// needs a page and passes statements that write nothing), the standby
// holds takeovers of lapsed leases back until writes land, and its held
// bids (which write the row unchanged to find out) end the hold a lease
// after they do (claimtest.RefusedWritesHoldTakeovers).
func TestRefusedWritesHoldTakeoversUntilWritesLand(t *testing.T) {
	ns := backends.Prepare(t, "postgres", backends.Options{})
	holder, standby := ns.Open("holder"), ns.Open("standby")
	set, err := backends.RefuseWrites(t.Context(), holder.DB)
	if err != nil {
		t.Fatal(err)
	}
	refuse := func(on bool) {
		t.Helper()
		if err := set(t.Context(), on); err != nil {
			t.Fatal(err)
		}
	}
	claimtest.RefusedWritesHoldTakeovers(t, holder.Claimer, standby.Claimer, refuse, time.Second)
}
