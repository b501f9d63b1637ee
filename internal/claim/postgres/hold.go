package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// The takeover hold (claim.Unanswered), as the other networked claimers
// keep it. A server that refuses writes (a full disk, 53100; a database
// set read-only or a standby behind the primary's address, 25006; a
// crash-restart, down or refusing connections) lets leases lapse while
// their holders can neither renew nor release. Without a hold, the first
// write to land afterwards decided: a standby's takeover bid, sent every
// few hundred milliseconds, came before the holder's release, retried
// every second at most, and a run whose handler had returned ran again
// (an outside review: 15 runs in 8 of 8 fills and read-only switches).
// PostgreSQL's lock queue serves a release that waits there first, but a
// refused release does not wait: it fails and is retried.
//
// So a write that went unanswered (refused, or past its deadline) holds
// this claimer's takeovers of lapsed leases back until writes have
// landed for a lease (takeOverRun's $7): the holders' retried releases
// land first, and a holder that died meanwhile is taken over a lease
// later. While the server refuses writes, a statement that wrote
// nothing (a bid for a run held or done) is no answer: such statements
// succeed on a full disk, and counted as answers they would end the
// hold by its chronic cap while every write was still refused (the
// SQLite claimer's finding, docs/hardening.md entry 36). A takeover held
// back therefore writes its run's row unchanged (takeOverRun's touch):
// it lands when a write to that row lands, which is when the holder's
// release to the same row can, so the hold ends once writes land again,
// and never while a dead holder's run waits for a write that nothing
// else sends.
//
// The Claimer keeps its hold in unanswered; wrote tells it what each write
// statement's outcome says of the server.

// wrote tells the hold what a write statement sent under ctx says of the
// server: err is the statement's error, changed whether it wrote a row.
func (c *Claimer) wrote(ctx context.Context, err error, changed bool) {
	switch {
	case err == nil && changed:
		c.unanswered.Landed()
	case err == nil || errors.Is(err, pgx.ErrNoRows):
		c.unanswered.Answered() // wrote nothing: no answer while writes are refused
	case errors.Is(err, context.DeadlineExceeded):
		c.unanswered.Note()
	case errors.Is(err, context.Canceled) || ctx.Err() != nil:
		// The caller left (a renewal stopped by its run's release): that
		// says nothing of the server. Noted, it held takeovers back for a
		// lease on a healthy one.
	case errors.Is(translate(err), claim.ErrUnavailable):
		c.unanswered.Refused(err)
	default:
		c.unanswered.Answered() // the server answered, with an error of another kind
	}
}

// waited reports, after a claim's round trip sent at sent, whether
// takeovers of lapsed leases are held back now: as after a call
// unanswered if the answer came later than claim.TakeoverWait. Such a
// bid's insert waited (in a stopped server, on a slow link), and so may a
// holder's release; its takeover, sent next, may land first (a bid sent
// with time to wait into a server stopped past the lease, its takeover
// landing before the holder's retried release). takeOverRun's $8 checks
// the takeover's own wait on the server.
func (c *Claimer) waited(sent time.Time, lease time.Duration) bool {
	if time.Since(sent) > claim.TakeoverWait(lease) {
		c.unanswered.Note()
	}
	return c.unanswered.Hold(lease)
}

// takeoverBy is takeOverRun's $8 for a bid whose insert, sent at sent,
// was stamped stamp on the server: the latest time on the server's clock
// at which the takeover sent next may take a lapsed lease over. From the
// stamp the takeover needs the insert's reply trip and its own send trip,
// about the insert's round trip; more than claim.TakeoverWait beyond that
// means it waited. So a slow link (round trips near a quarter lease) does
// not keep a dead holder's runs from being taken over.
func takeoverBy(stamp, sent time.Time, lease time.Duration) time.Time {
	return stamp.Add(time.Since(sent) + claim.TakeoverWait(lease))
}

// refusal is the server's latest refusal of a write, if it came within the
// last minute and no write landed since: readiness reports it, as its
// probe writes nothing and passes on a full disk.
func (c *Claimer) refusal() error {
	if err := c.unanswered.Refusal(time.Minute); err != nil {
		return fmt.Errorf("the last write was refused, and none landed since: %w", translate(err))
	}
	return nil
}

var (
	_ claim.TakeoverHolder = (*Claimer)(nil)
	_ claim.Settler        = (*Claimer)(nil)
)

// TakeoversHeld implements claim.TakeoverHolder.
func (c *Claimer) TakeoversHeld(lease time.Duration) bool { return c.unanswered.Hold(lease) }

// Settle implements claim.Settler.
func (c *Claimer) Settle() { c.unanswered.Settle() }
