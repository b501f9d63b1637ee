package claimers_test

import (
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
)

// holding is a claimer that holds takeovers back and watches for data
// loss, as the networked claimers do.
type holding struct {
	claim.Claimer
	held    bool
	watched bool
}

func (h *holding) TakeoversHeld(time.Duration) bool     { return h.held }
func (h *holding) WatchLoss(func(*claim.DataLossError)) { h.watched = true }

// TestABackendPassesItsClaimersHoldAndWatchOn: a runner given a Backend
// (the explorer's and compare's are) sees the claimer's takeover hold and
// loss watch, which embedding the Claimer interface alone hid from it.
func TestABackendPassesItsClaimersHoldAndWatchOn(t *testing.T) {
	h := &holding{Claimer: memory.New(memory.NewStore(nil), "a"), held: true}
	var b claim.Claimer = &claimers.Backend{Claimer: h}
	if !claim.HeldBy(b, time.Second) {
		t.Error("a Backend over a claimer holding takeovers says none are held")
	}
	claim.WatchLossOf(b, func(*claim.DataLossError) {})
	if !h.watched {
		t.Error("a Backend did not pass WatchLoss on to its claimer")
	}
	h.held = false
	if claim.HeldBy(b, time.Second) {
		t.Error("a Backend says takeovers are held after its claimer's hold ended")
	}
	// A claimer that holds nothing: no hold, and no watch to start.
	plain := &claimers.Backend{Claimer: memory.New(memory.NewStore(nil), "b")}
	if plain.TakeoversHeld(time.Second) {
		t.Error("a Backend over the memory claimer says takeovers are held")
	}
	plain.WatchLoss(func(*claim.DataLossError) {})
}
