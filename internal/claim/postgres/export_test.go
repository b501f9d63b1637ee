package postgres

import "github.com/scheduler-dev/scheduler/internal/claim"

// TakeOverRun is the takeover statement, for tests of what it decides.
const TakeOverRun = takeOverRun

// WaitForHandBacks waits for c's hand-backs of grants whose replies were
// lost (abandonLater) to end.
func WaitForHandBacks(c claim.Claimer) { c.(*Claimer).undos.Wait() }
