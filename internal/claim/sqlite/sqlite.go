// Package sqlite is a claim.Claimer on a local SQLite file (modernc.org/sqlite,
// no cgo): the embedded default. Several processes on one host coordinate
// through one file: WAL journal, single-statement writes (which take the
// write lock before they read) and a busy timeout serialize them, and leases
// are measured on SQLite's clock (the host's), in integer unix milliseconds.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"modernc.org/sqlite" // also registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/migrations"
)

// nowMS is SQLite's clock in unix milliseconds. Within one statement every
// use reads the same instant.
const nowMS = `CAST(unixepoch('subsec') * 1000 AS INTEGER)`

// leaseFrom is where a lease's end counts from (the lease in ms is added
// to it): the millisecond after nowMS. SQLite's clock has whole
// milliseconds, so the statement runs somewhere within the one nowMS
// names; dated from its start, the lease could end up to a millisecond
// before the holder's request time + lease, and a takeover come that
// much early (the explorer found the same on Redis, whose script
// truncated likewise).
const leaseFrom = nowMS + ` + 1`

// takeoverBy is claimRun's ?8 for a bid sent now: the latest time, on
// nowMS's clock (this host's), at which it may still take over a lapsed
// lease.
func takeoverBy(lease time.Duration) int64 { return time.Now().Add(lease / 4).UnixMilli() }

const (
	// claimRun grants a fresh run, or takes over an interrupted or expired
	// one, in one statement; it returns no row when the run is held or done,
	// or when it is expired and takeovers are held back: ?7, the claimer's
	// writes went unanswered within the last lease (claim.Unanswered), or
	// the statement runs after ?8, the bid's send plus a quarter lease (it
	// waited for the write lock that long, and a holder's release may be
	// waiting behind it). ?9, when not empty, is the token of this
	// claimer's own grant whose caller gave up and whose hand-back was
	// lost (claim.Unseen): a run still held under it is taken at once,
	// as the same attempt, where its ghost would hold it off for a lease.
	// The fence is the counter's next value, and the schema's triggers
	// advance the counter in the statement's own transaction. A write
	// statement takes SQLite's write lock before it reads, so two claims
	// never both see a run as free.
	claimRun = `
INSERT INTO scheduler_runs
       (run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until)
VALUES (?1, ?2, ?3, 'running', ?4, ?5, (SELECT value + 1 FROM scheduler_fence WHERE id = 1), 1,
        ` + nowMS + `, ` + leaseFrom + ` + ?6)
ON CONFLICT (run_id) DO UPDATE
   SET status = 'running', token = excluded.token, holder = excluded.holder,
       fence = excluded.fence, attempt = scheduler_runs.attempt + (scheduler_runs.token NOT IN ('', ?9)),
       started_at = excluded.started_at, lease_until = excluded.lease_until, finished_at = NULL
 WHERE scheduler_runs.status = 'interrupted'
    OR (scheduler_runs.status = 'running' AND scheduler_runs.lease_until <= excluded.started_at
        AND NOT ?7 AND excluded.started_at <= ?8)
    OR (scheduler_runs.status = 'running' AND ?9 <> '' AND scheduler_runs.token = ?9)
RETURNING fence, attempt, lease_until`

	// abandonRun hands back a grant whose caller gave up while its
	// statement ran (abandonLater): the row stays, interrupted, and its token
	// is cleared, which tells claimRun that this attempt never started:
	// the next grant is the same attempt.
	abandonRun = `
UPDATE scheduler_runs
   SET status = 'interrupted', lease_until = ` + nowMS + `, token = ''
 WHERE run_id = ?1 AND token = ?2 AND status = 'running'`

	// runState reads a run without taking the write lock (WAL readers never
	// wait): the fence counter (see file.observed), and whether the run
	// exists, its status, and whether its lease is live.
	runState = `
SELECT f.value, r.status, r.lease_until > ` + nowMS + `
  FROM scheduler_fence f LEFT JOIN scheduler_runs r ON r.run_id = ?1
 WHERE f.id = 1`

	renewRun = `
UPDATE scheduler_runs
   SET lease_until = ` + leaseFrom + ` + ?3
 WHERE run_id = ?1 AND token = ?2 AND status = 'running' AND lease_until > ` + nowMS + `
RETURNING lease_until`

	// releaseRun is allowed after the lease expired as long as nobody took
	// the run over: the token still matches then. A retry of a release
	// that took effect (same token, same outcome) matches and changes
	// nothing.
	releaseRun = `
UPDATE scheduler_runs
   SET status = ?3,
       finished_at = CASE WHEN status <> 'running' THEN finished_at WHEN ?4 THEN ` + nowMS + ` END
 WHERE run_id = ?1 AND token = ?2 AND (status = 'running' OR status = ?3)`

	historyColumns = `
SELECT run_id, job, status, holder, fence, attempt, started_at, lease_until, finished_at
  FROM scheduler_runs`
	// A negative limit is no limit.
	historyAll = historyColumns + `
 ORDER BY scheduled_at DESC, job LIMIT ?1`
	historyJob = historyColumns + `
 WHERE job = ?1 ORDER BY scheduled_at DESC LIMIT ?2`

	pruneRuns = `DELETE FROM scheduler_runs WHERE finished_at < ` + nowMS + ` - ?1`

	// probe is readiness: a write that changes nothing, of a row, so that
	// it appends a page to the log like a claim and fails where a claim
	// would (a file or connection that is read-only, a full disk, a lock
	// held past the busy timeout, a table gone), which a ping that only
	// opens the file never sees. (A statement that matched no row wrote
	// nothing, and passed on a full disk: found by an outside review.)
	probe = `UPDATE scheduler_fence SET value = value WHERE id = 1`
)

// idleConns is database/sql's default number of idle connections, restored
// after a read-only connection made the Claimer close them all.
const idleConns = 2

// Options configure a Claimer.
type Options struct {
	// Instance is the holder id written into claims.
	Instance string
	// SyncNormal opens the file with synchronous=NORMAL instead of FULL:
	// the WAL is synced at checkpoints, not at every commit, so a claim
	// never waits on the disk. A process crash loses nothing; a power loss
	// or OS crash can forget the last claims and releases, and runs that
	// had just finished may then run again. For busy disks and short
	// leases, where a sync can outlast a claim's timeout.
	SyncNormal bool
}

// Claimer grants claims through rows of the scheduler_runs table in one
// SQLite file. It is safe for concurrent use.
type Claimer struct {
	db       *sql.DB
	stmts    stmts
	instance string
	owned    bool // Close closes db
	// writer admits one write statement of this Claimer at a time. SQLite
	// runs one writer per file anyway; queuing writers here, in order and
	// honouring ctx, is fairer and cheaper than every connection sleep-polling
	// in SQLite's busy handler, which under load starves some past the busy
	// timeout. Other processes still wait in the busy handler.
	writer chan struct{}
	undos  claim.Stragglers // abandonLater's, which Close waits for
	unseen claim.Unseen     // grants handed back by abandonLater, which may have been lost
	// file is the file Open opened; nil for New, whose caller owns it.
	file *file
	// unanswered holds takeovers back after a write went unanswered or
	// was refused (claimRun, write). Readiness reports its refusal of a
	// claim, renewal or release for a minute: a probe that rewrites one
	// row can fit where claims do not, on a full disk, in the space the
	// log already has (found by an outside review).
	unanswered claim.Unanswered
}

// Open opens (creating it if needed) the SQLite file at path, applies the
// migrations, and returns a Claimer that closes the file on Close.
func Open(ctx context.Context, path string, opts Options) (*Claimer, error) {
	sync := "FULL"
	if opts.SyncNormal {
		sync = "NORMAL"
	}
	// Absolute: the replicas share the file the path names now, not the
	// one a relative path would name after the working directory was
	// renamed away (found by an outside review: the replicas in a renamed
	// directory and one started in a new one each kept a ledger).
	path, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	// The files' identities are the ones the path names both before and
	// after the connections of the migrations were opened: a file created
	// by this open, or deleted or replaced during it, may have some of
	// them on another file than the one the path names after it (found
	// by the test of replicas on a deleted file: one recorded the new file
	// and claimed on the old one). Such an open is made again; by then the
	// file exists.
	for attempt := 1; ; attempt++ {
		before, _ := os.Stat(path) // nil if there is no file yet
		if before == nil {
			// SQLite says only "unable to open database file".
			if _, err := os.Stat(filepath.Dir(path)); err != nil {
				return nil, fmt.Errorf("sqlite: open %s: its directory: %w", path, err)
			}
		}
		if before != nil {
			// Before anything is written through a name of several.
			if err := oneName(path, before); err != nil {
				return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
			}
		}
		db, err := sql.Open("sqlite", migrations.SQLiteDSN(path)+"&_pragma=synchronous("+sync+")")
		if err != nil {
			return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
		}
		if err := migrations.Up(ctx, db, migrations.SQLite); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("sqlite: open %s: %w", path, translate(err))
		}
		if afterMigrate != nil {
			afterMigrate()
		}
		f, err := pin(ctx, db, path, before)
		if err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("sqlite: open %s: %w", path, translate(err))
		}
		if f != nil {
			c := New(db, opts)
			c.owned = true
			c.file = f
			return c, nil
		}
		_ = db.Close()
		if attempt == 3 {
			return nil, fmt.Errorf("%w: sqlite: open %s: the path named another file each time it was opened", claim.ErrUnavailable, path)
		}
	}
}

// afterMigrate, if set, runs in Open between the migrations and the
// second look at the file: a test swaps the file there.
var afterMigrate func()

// New returns a Claimer on db, which must be migrated and opened with DSN's
// settings (above all _txlock=immediate). Close does not close db.
func New(db *sql.DB, opts Options) *Claimer {
	if db == nil {
		panic("sqlite: nil db")
	}
	c := &Claimer{db: db, stmts: stmts{db: db}, instance: opts.Instance, writer: make(chan struct{}, 1)}
	c.unanswered.Start()
	return c
}

// leaseMS is lease in whole milliseconds, rounded up, plus one: SQLite's
// clock reads in truncated milliseconds, and the lease it records must never
// be shorter than the one asked for (see claim.Claim.Requested).
func leaseMS(lease time.Duration) int64 {
	return int64((lease+time.Millisecond-1)/time.Millisecond) + 1
}

// claimOne is Claim for a single run. Most bids are lost (every replica bids
// for every run), so it first reads the run, which in WAL mode never waits
// for the write lock, and answers held or done from that read. Only a run
// that looks free is bid for with the write statement, which decides; a bid
// lost in that race reads the run again to tell held from done.
func (c *Claimer) claimOne(ctx context.Context, run claim.Run, lease time.Duration) (*claim.Claim, error) {
	run.At = run.At.UTC()
	id := run.ID()
	unseen := c.unseenToken(id)
	if err := c.lostBid(ctx, id, true); err != nil && (unseen == "" || !errors.Is(err, claim.ErrHeld)) {
		return nil, fmt.Errorf("claim %s: %w", id, err)
	}
	cl := &claim.Claim{Run: run, Token: claim.NewToken(), Holder: c.instance, Lease: lease}
	var deadline int64
	by := takeoverBy(lease)
	defer c.waited(by)
	err := c.write(ctx, func() error {
		cl.Requested = time.Now()
		mark := c.file.mark()
		err := c.stmts.queryRow(ctx, claimRun,
			[]any{id, run.Job, run.At.UnixMilli(), cl.Token, c.instance, leaseMS(lease), c.unanswered.Hold(lease), by, unseen},
			&cl.Fence, &cl.Attempt, &deadline)
		if err != nil {
			return err
		}
		return c.file.granted(mark, cl.Fence)
	})
	switch {
	case err == nil:
		cl.Deadline = time.UnixMilli(deadline).UTC()
		return cl, nil
	case !errors.Is(err, sql.ErrNoRows):
		if ctx.Err() != nil {
			c.abandonLater(ctx, id, cl.Token, lease)
		}
		return nil, fmt.Errorf("claim %s: %w", id, translate(err))
	}
	err = c.lostBid(ctx, id, false)
	if err == nil { // it was free a moment ago, so someone else won it
		err = claim.ErrHeld
	}
	return nil, fmt.Errorf("claim %s: %w", id, err)
}

// abandonLater hands back, on a goroutine of its own and within a
// second, the grant of run id to token if the claim's statement landed
// before its caller gave up (ctx): the statement commits as it steps, and
// database/sql may then answer the caller's context error from the scan.
// Left alone, the grant held the run for a lease with nobody to run it,
// and spent an attempt (the conformance suite's given-up case, under
// -race). The caller does not wait for it (it may wait for the lock of a
// file another process holds), and it tells the takeover hold nothing:
// the claim's own outcome did. The hand-back may be lost too (the file
// locked past its second by another process): the next claim of the run
// takes the grant, if it stands (claimRun's ?9).
func (c *Claimer) abandonLater(ctx context.Context, id, token string, lease time.Duration) {
	c.unseen.Note(id, token, time.Now().Add(lease))
	c.undos.Go(func() {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = c.queue(actx, func() error {
			_, err := c.stmts.exec(actx, abandonRun, id, token)
			return err
		})
	})
}

// unseenToken is claimRun's ?9 for the run with id runID.
func (c *Claimer) unseenToken(runID string) string {
	if token, ok := c.unseen.Take(runID); ok {
		return token
	}
	return ""
}

// lostBid reads run id and returns ErrHeld or ErrDone if it cannot be won
// now, nil if it looks free. A missing row is free before the bid, and
// pruned (done) after it.
func (c *Claimer) lostBid(ctx context.Context, id string, beforeBid bool) error {
	var (
		counter int64
		status  sql.NullString
		live    sql.NullBool
	)
	mark := c.file.mark()
	err := c.stmts.queryRow(ctx, runState, []any{id}, &counter, &status, &live)
	if err == nil {
		err = c.file.observed(mark, counter)
	}
	switch {
	case err != nil:
		return translate(err)
	case !status.Valid && beforeBid:
		return nil
	case !status.Valid:
		// The row existed at the bid and only Prune deletes rows, and only
		// finished ones.
		return claim.ErrDone
	case !claim.Status(status.String).Live():
		return claim.ErrDone
	case claim.Status(status.String) == claim.Running && live.Bool:
		return claim.ErrHeld
	}
	return nil
}

// write runs f, one write statement, once no other write of c is running
// and if the path still names the file c opened, and notes whether the
// file refused it.
func (c *Claimer) write(ctx context.Context, f func() error) error {
	err := c.queue(ctx, f)
	switch {
	case err == nil:
		c.unanswered.Landed()
	case errors.As(err, new(*sqlite.Error)) && errors.Is(translate(err), claim.ErrUnavailable):
		// Refused: a full disk, an I/O error, read-only, or locked past
		// the busy timeout. Until a write lands, a statement that wrote
		// nothing (a takeover bid held back, sql.ErrNoRows) says nothing
		// of whether a holder's release can: counted as answers, the held
		// bids themselves ended the hold by its chronic cap on a disk full
		// for three leases, and a standby took over a finished run the
		// moment space came back, before its holder's retried release (an
		// outside review: run twice, 4 times of 4).
		c.unanswered.Refused(err)
	case errors.Is(translate(err), claim.ErrUnavailable) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		// Unanswered: the file moved away, or the caller's time ran out
		// waiting. A caller that cancelled (a renewal stopped by its run's
		// release) says nothing of the file: noted, it held takeovers back
		// for a lease on a healthy disk (an outside review).
		c.unanswered.Note()
	default:
		c.unanswered.Answered()
	}
	return err
}

// waited notes a claim that ended past by, its takeoverBy: it waited
// for the write lock so long that claimRun held its takeovers back, and
// the writes of this claimer's next lease hold theirs too, as after an
// unanswered one.
func (c *Claimer) waited(by int64) {
	if time.Now().UnixMilli() > by {
		c.unanswered.Note()
	}
}

// queue is write without the note of the outcome: for readiness, which
// reads it.
func (c *Claimer) queue(ctx context.Context, f func() error) error {
	select {
	case c.writer <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.writer }()
	if err := c.file.check(); err != nil {
		return err
	}
	err := f()
	var se *sqlite.Error
	if c.owned && errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_READONLY {
		// SQLite opens a file it may not write read-only, silently, and the
		// connection stays so for its life: one opened while the file was
		// read-only would refuse every write after the file is writable
		// again. The failed statement's connection is idle now; closing
		// the idle connections makes the next write open a new one.
		c.db.SetMaxIdleConns(0)
		c.db.SetMaxIdleConns(idleConns)
	}
	return err
}

// Renew implements claim.Claimer.
func (c *Claimer) Renew(ctx context.Context, cl *claim.Claim, lease time.Duration) error {
	if err := claim.CheckRenew(cl, lease); err != nil {
		return err
	}
	var (
		requested time.Time
		deadline  int64
	)
	err := c.write(ctx, func() error {
		requested = time.Now()
		return c.stmts.queryRow(ctx, renewRun, []any{cl.ID(), cl.Token, leaseMS(lease)}, &deadline)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("renew %s: %w", cl.ID(), claim.ErrLeaseLost)
	case err != nil:
		return fmt.Errorf("renew %s: %w", cl.ID(), translate(err))
	}
	cl.Deadline, cl.Requested, cl.Lease = time.UnixMilli(deadline).UTC(), requested, lease
	return nil
}

// releaseOne is Release for a single claim, in one statement.
func (c *Claimer) releaseOne(ctx context.Context, cl *claim.Claim, o claim.Status) error {
	var res sql.Result
	err := c.write(ctx, func() (err error) {
		res, err = c.stmts.exec(ctx, releaseRun, cl.ID(), cl.Token, string(o), o.Terminal())
		return err
	})
	if err != nil {
		return fmt.Errorf("release %s: %w", cl.ID(), translate(err))
	}
	n, err := res.RowsAffected()
	switch {
	case err != nil:
		return fmt.Errorf("release %s: %w", cl.ID(), translate(err))
	case n == 0:
		return fmt.Errorf("release %s: %w", cl.ID(), claim.ErrLeaseLost)
	}
	return nil
}

// Claim implements claim.Claimer: claimOne's read of every run, then its
// write statement for each run that looked free, all in one transaction. SQLite commits (and syncs) once per transaction, so 1,000
// runs cost one commit instead of 1,000. If the transaction fails, no run
// of it was granted.
func (c *Claimer) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	claims, errs := make([]*claim.Claim, len(runs)), make([]error, len(runs))
	// Before the reads that skip runs held or done: on another file they
	// would answer from another ledger.
	if err := c.file.check(); err != nil {
		for i, run := range runs {
			errs[i] = fmt.Errorf("claim %s: %w", run.ID(), err)
		}
		return claims, errs
	}
	if len(runs) == 1 {
		if errs[0] = claim.CheckClaim(runs[0], lease); errs[0] == nil {
			claims[0], errs[0] = c.claimOne(ctx, runs[0], lease)
		}
		return claims, errs
	}
	var bids []int
	unseen := make([]string, len(runs))
	for i, run := range runs {
		if errs[i] = claim.CheckClaim(run, lease); errs[i] != nil {
			continue
		}
		run.At = run.At.UTC()
		unseen[i] = c.unseenToken(run.ID())
		if err := c.lostBid(ctx, run.ID(), true); err != nil && (unseen[i] == "" || !errors.Is(err, claim.ErrHeld)) {
			errs[i] = fmt.Errorf("claim %s: %w", run.ID(), err)
			continue
		}
		claims[i] = &claim.Claim{Run: run, Token: claim.NewToken(), Holder: c.instance, Lease: lease}
		bids = append(bids, i)
	}
	if len(bids) == 0 {
		return claims, errs
	}
	won := make([]bool, len(runs))
	hold, by := c.unanswered.Hold(lease), takeoverBy(lease)
	defer c.waited(by)
	err := c.write(ctx, func() error {
		requested := time.Now()
		mark := c.file.mark()
		err := c.stmts.inTx(ctx, func(stmt func(string) (*sql.Stmt, error)) error {
			st, err := stmt(claimRun)
			if err != nil {
				return err
			}
			for _, i := range bids {
				cl, run := claims[i], claims[i].Run
				var deadline int64
				err := st.QueryRowContext(ctx, run.ID(), run.Job, run.At.UnixMilli(), cl.Token, c.instance, leaseMS(lease), hold, by, unseen[i]).
					Scan(&cl.Fence, &cl.Attempt, &deadline)
				switch {
				case err == nil:
					won[i], cl.Requested, cl.Deadline = true, requested, time.UnixMilli(deadline).UTC()
				case !errors.Is(err, sql.ErrNoRows):
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		var fences []int64
		for _, i := range bids {
			if won[i] {
				fences = append(fences, claims[i].Fence)
			}
		}
		return c.file.granted(mark, fences...)
	})
	for _, i := range bids {
		id := claims[i].ID()
		switch {
		case err != nil:
			claims[i], errs[i] = nil, fmt.Errorf("claim %s: %w", id, translate(err))
		case !won[i]:
			claims[i] = nil
			if errs[i] = c.lostBid(ctx, id, false); errs[i] == nil {
				errs[i] = claim.ErrHeld // it was free a moment ago, so someone else won it
			}
			errs[i] = fmt.Errorf("claim %s: %w", id, errs[i])
		}
	}
	return claims, errs
}

// Release implements claim.Claimer: releaseOne's statement for
// every claim, in one transaction. If the transaction fails, none of its
// releases stands.
func (c *Claimer) Release(ctx context.Context, cls []*claim.Claim, outcomes []claim.Status) []error {
	errs, pending := claim.CheckReleaseBatch(cls, outcomes)
	switch len(pending) {
	case 0:
		return errs
	case 1:
		errs[pending[0]] = c.releaseOne(ctx, cls[pending[0]], outcomes[pending[0]])
		return errs
	}
	err := c.write(ctx, func() error {
		return c.stmts.inTx(ctx, func(stmt func(string) (*sql.Stmt, error)) error {
			st, err := stmt(releaseRun)
			if err != nil {
				return err
			}
			for _, i := range pending {
				o := outcomes[i]
				res, err := st.ExecContext(ctx, cls[i].ID(), cls[i].Token, string(o), o.Terminal())
				if err != nil {
					return err
				}
				if n, err := res.RowsAffected(); err != nil {
					return err
				} else if n == 0 {
					errs[i] = claim.ErrLeaseLost
				}
			}
			return nil
		})
	})
	for _, i := range pending {
		if err != nil {
			errs[i] = translate(err)
		}
		if errs[i] != nil {
			errs[i] = fmt.Errorf("release %s as %s: %w", cls[i].ID(), outcomes[i], errs[i])
		}
	}
	return errs
}

// Ping implements claim.Claimer: a write that changes nothing (probe) can
// be made to the file c opened.
func (c *Claimer) Ping(ctx context.Context) error {
	err := c.queue(ctx, func() error {
		if err := c.unanswered.Refusal(time.Minute); err != nil {
			return fmt.Errorf("the last write was refused, and none succeeded since: %w", err)
		}
		_, err := c.stmts.exec(ctx, probe)
		return err
	})
	if err != nil {
		return fmt.Errorf("ping: %w", translate(err))
	}
	return nil
}

// Close implements claim.Claimer. It closes the database only if Open
// opened it.
func (c *Claimer) Close() error {
	c.undos.Wait()
	err := c.stmts.close()
	if c.file != nil {
		err = errors.Join(err, c.file.pin.Close())
	}
	if c.owned {
		err = errors.Join(err, c.db.Close())
	}
	return err
}

// History implements claim.Claimer: runs newest scheduled instant first,
// of job or, if job is "", of every job; limit <= 0 means no limit.
func (c *Claimer) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	if limit <= 0 {
		limit = -1
	}
	var (
		rows *sql.Rows
		err  error
	)
	if job == "" {
		rows, err = c.stmts.query(ctx, historyAll, limit)
	} else {
		rows, err = c.stmts.query(ctx, historyJob, job, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("history: %w", translate(err))
	}
	defer rows.Close()
	var recs []claim.Record
	for rows.Next() {
		var (
			r                   claim.Record
			started, leaseUntil int64
			finished            sql.NullInt64
		)
		if err := rows.Scan(&r.RunID, &r.Job, &r.Status, &r.Holder, &r.Fence, &r.Attempt,
			&started, &leaseUntil, &finished); err != nil {
			return nil, fmt.Errorf("history: %w", translate(err))
		}
		// The id carries the exact instant; the column is in milliseconds.
		if run, err := claim.ParseID(r.RunID); err == nil {
			r.At = run.At
		}
		r.StartedAt, r.LeaseUntil = time.UnixMilli(started).UTC(), time.UnixMilli(leaseUntil).UTC()
		if finished.Valid {
			r.FinishedAt = time.UnixMilli(finished.Int64).UTC()
		}
		recs = append(recs, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("history: %w", translate(err))
	}
	return recs, nil
}

// Prune deletes runs that finished (succeeded, failed or skipped) more than
// olderThan ago, on SQLite's clock, and returns how many it deleted. It is
// the retention policy: call it periodically from one place.
//
// A pruned run is forgotten: a replica that later claims the same run would
// be granted it again as attempt 1. olderThan must be at least the longest
// window in which replicas still claim a finished run (config.ClaimWindow
// over every job; `scheduler prune` refuses less).
// Interrupted runs and expired leases are kept: they are not finished, and
// deleting them would lose the attempt count and let a stale run restart.
//
// In the same transaction it deletes expired controls (see Controls), which
// are already invisible; they do not count in the number returned.
func (c *Claimer) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: prune older than %v", claim.ErrInvalid, olderThan)
	}
	var n int64
	err := c.write(ctx, func() error {
		return c.stmts.inTx(ctx, func(stmt func(string) (*sql.Stmt, error)) error {
			st, err := stmt(pruneRuns)
			if err != nil {
				return err
			}
			res, err := st.ExecContext(ctx, olderThan.Milliseconds())
			if err != nil {
				return err
			}
			if n, err = res.RowsAffected(); err != nil {
				return err
			}
			if st, err = stmt(pruneControls); err != nil {
				return err
			}
			_, err = st.ExecContext(ctx)
			return err
		})
	})
	if err != nil {
		return 0, fmt.Errorf("prune: %w", translate(err))
	}
	return n, nil
}

var (
	_ claim.TakeoverHolder = (*Claimer)(nil)
	_ claim.Settler        = (*Claimer)(nil)
)

// TakeoversHeld implements claim.TakeoverHolder.
func (c *Claimer) TakeoversHeld(lease time.Duration) bool { return c.unanswered.Hold(lease) }

// Settle implements claim.Settler.
func (c *Claimer) Settle() { c.unanswered.Settle() }
