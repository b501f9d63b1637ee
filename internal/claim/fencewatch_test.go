package claim_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

func TestFenceWatchJudgesByWhatARequestKnew(t *testing.T) {
	lost := func(w *claim.FenceWatch) bool {
		select {
		case <-w.Lost():
			return true
		default:
			return false
		}
	}
	w := claim.NewFenceWatch("the database", "restored?")
	a, b := w.Mark(), w.Mark() // two requests in flight at once
	if err := w.Granted(a, 7, 9); err != nil {
		t.Fatal(err)
	}
	// b was sent before 7 and 9 came back: a lower fence is no loss.
	if err := w.Granted(b, 5); err != nil || lost(w) {
		t.Fatalf("a grant to a request sent before a higher one came back: %v", err)
	}
	if err := w.Observed(w.Mark(), 9); err != nil {
		t.Fatalf("the counter read where it was: %v", err)
	}
	// Sent after 9 came back: 9 again, or below, is a loss.
	err := w.Granted(w.Mark(), 9)
	if !errors.Is(err, claim.ErrUnavailable) || !strings.Contains(err.Error(), "the database went back in time: fence 9 was granted after 9 (restored?)") || !lost(w) {
		t.Fatalf("fence 9 again: %v, lost %v", err, lost(w))
	}
	if got := w.Lose(errors.New("another")); got != err || w.Err() != err {
		t.Fatalf("a second loss replaced the first: %v", got)
	}
	if err := w.Granted(0, 100); err == nil {
		t.Fatal("a grant after the loss passed")
	}

	r := claim.NewFenceWatch("the file", "copied over?")
	_ = r.Observed(0, 15)
	if err := r.Observed(r.Mark(), 7); err == nil || !strings.Contains(err.Error(), "read 7 after 15") {
		t.Fatalf("the counter read below the mark: %v", err)
	}
}
