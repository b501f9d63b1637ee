package cli

import (
	"testing"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
)

// A run's note counts its earlier attempts by how they ended: attempts
// handed back at a shutdown (interrupted) are not called failed.
func TestAttemptsNoteNamesHowTheAttemptsEnded(t *testing.T) {
	at := func(sts ...claim.Status) []control.Attempt {
		var out []control.Attempt
		for i, st := range sts {
			out = append(out, control.Attempt{Attempt: i + 1, Status: st})
		}
		return out
	}
	for _, tt := range []struct {
		atts []control.Attempt
		want string
	}{
		{at(claim.Failed), "1 failed attempt (--attempts)"},
		{at(claim.Interrupted, claim.Interrupted, claim.Interrupted, claim.Interrupted), "4 interrupted attempts (--attempts)"},
		{at(claim.Failed, claim.Interrupted, claim.Interrupted), "3 earlier attempts: 1 failed, 2 interrupted (--attempts)"},
	} {
		if got := attemptsNote(tt.atts); got != tt.want {
			t.Errorf("attemptsNote(%v) = %q, want %q", tt.atts, got, tt.want)
		}
	}
}
