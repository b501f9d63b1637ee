package sqlite

import (
	"context"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// AbandonAndWait hands cl back as the claim of a caller who gave up while
// its statement landed is handed back (abandonLater), and waits until
// the hand-back has ended, landed or not.
func AbandonAndWait(c *Claimer, cl *claim.Claim) {
	c.abandonLater(context.Background(), cl.ID(), cl.Token, cl.Lease)
	c.undos.Wait()
}
