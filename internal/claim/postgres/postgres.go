// Package postgres is a claim.Claimer on PostgreSQL (pgx/v5). A replica wins
// a run by inserting the run's row; leases are measured on the database's
// clock, never a replica's; fences come from a global sequence. The schema is
// created by the migrations package: scheduler_runs is partitioned by month
// of scheduled_at (see partitions.go), so every statement that names a run
// also names its instant, which takes it to the one partition that can hold
// the run.
package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

const (
	// lockHead and lockTail, around a parameter holding an int[] of job
	// buckets (bucketOf; repeats allowed), take those buckets' advisory
	// locks (keyed 23789, bucket) shared until the end of the
	// transaction: grants of one job do not wait for each other, and in
	// ascending order, so nothing that takes them deadlocks. A history
	// read takes them exclusively (scheduler_histories, migration
	// 00005). Renders the number of buckets locked.
	lockHead = `SELECT count(l) FROM (SELECT pg_advisory_xact_lock_shared(23789, b)::text AS l
  FROM (SELECT DISTINCT b FROM unnest(`
	lockTail = `::int[]) AS b ORDER BY b) AS s) AS x`
	// lockJobs is the first statement of a transaction that grants
	// several runs one statement at a time: each statement's own lock is
	// then taken already, so none waits for a lock while its transaction
	// holds the rows an earlier one wrote.
	lockJobs = lockHead + `$1` + lockTail

	// A grant's statement starts with its jobs' locks and then reads the
	// stamp (started_at), after them: a history read that holds the locks
	// either waits for the grant to commit, and sees it, or has read
	// before the grant was stamped, which then comes after the run that
	// read in the runner's overlap order (runs are ordered by their
	// stamps). now(), the transaction's start, would predate the lock: a
	// grant committed after a read could come first in that order, unseen
	// by it. Its buckets are $7 (insertRun, insertRuns) or $6
	// (takeOverRun).
	stampAfterLocks = `,
     stamp AS MATERIALIZED (SELECT clock_timestamp() AS t FROM locked)`
	lockedStamped7 = `locked AS MATERIALIZED (` + lockHead + `$7` + lockTail + `)` + stampAfterLocks
	lockedStamped6 = `locked AS MATERIALIZED (` + lockHead + `$6` + lockTail + `)` + stampAfterLocks

	// insertRun grants a run nobody has claimed yet. nextval is evaluated
	// even when the row exists: fences may skip values, never repeat. The
	// conflict target is the primary key, (run_id, scheduled_at): the run
	// id is the job and the instant, so the pair is unique exactly when the
	// id is, and the partitioned table's key must contain scheduled_at.
	// Its one row carries the statement's stamp, granted or not: a
	// takeover that follows must run within claim.TakeoverWait of it,
	// beyond its trips (takeOverRun's $8).
	insertRun = `
WITH ` + lockedStamped7 + `,
ins AS (
    INSERT INTO scheduler_runs
           (run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until)
    SELECT $1, $2, $3, 'running', $4, $5, nextval('scheduler_fence_seq'), 1,
           stamp.t, now() + $6 * interval '1 microsecond'
      FROM stamp
    ON CONFLICT (run_id, scheduled_at) DO NOTHING
    RETURNING fence, attempt, lease_until
)
SELECT ins.fence, ins.attempt, ins.lease_until, stamp.t FROM stamp LEFT JOIN ins ON true`

	// takeOverRun grants an interrupted or expired run to a new holder. When
	// it cannot, the second branch returns the run's status, so held and done
	// are told apart without another round trip. That branch reads the
	// statement's snapshot, which may predate a concurrent change; any
	// non-terminal status then reads as held, which is what it is. $5 is
	// the run's instant, as in every statement below that names a run.
	// $7 holds the takeover of a lapsed lease back (see hold.go): such a
	// run's row is then written unchanged instead (touched, the last
	// column), so that the bid finds out whether writes land. So does a
	// statement that runs after $8 (takeoverBy: its bid's insert's stamp,
	// plus the insert's round trip and claim.TakeoverWait): it waited (in
	// a stopped server, on a lock) long enough to have overtaken a
	// holder's release that waited with it. $9, when not empty, is the
	// token of this claimer's own bid whose reply and hand-back were both
	// lost (claim.Unseen): a run still held under it is taken at once, as
	// the same attempt, where its ghost would hold it off for a lease,
	// and even while takeovers are held: the grant is its own, and never
	// started. Such a row is not touched: two writes of one row in one
	// statement are not defined, and the take must be the one.
	takeOverRun = `
WITH ` + lockedStamped6 + `,
taken AS (
    UPDATE scheduler_runs
       SET status = 'running', token = $2, holder = $3,
           fence = nextval('scheduler_fence_seq'), attempt = attempt + (token <> '' AND token <> $9)::int,
           started_at = (SELECT t FROM stamp), lease_until = now() + $4 * interval '1 microsecond',
           finished_at = NULL
     WHERE run_id = $1 AND scheduled_at = $5
       AND (status = 'interrupted' OR (status = 'running' AND lease_until <= now()
            AND NOT $7::boolean AND clock_timestamp() <= $8)
            OR (status = 'running' AND $9 <> '' AND token = $9))
    RETURNING fence, attempt, lease_until
),
touched AS (
    UPDATE scheduler_runs SET lease_until = lease_until
     WHERE run_id = $1 AND scheduled_at = $5 AND ($7::boolean OR clock_timestamp() > $8)
       AND status = 'running' AND lease_until <= now() AND NOT ($9 <> '' AND token = $9)
    RETURNING 1
)
SELECT true, fence, attempt, lease_until, '', false FROM taken
UNION ALL
SELECT false, 0, 0, lease_until, status, EXISTS (SELECT FROM touched) FROM scheduler_runs
 WHERE run_id = $1 AND scheduled_at = $5 AND NOT EXISTS (SELECT FROM taken)`

	// insertRuns is insertRun for many runs at once, in run id order: every
	// batch takes the rows' locks in the same order, so two batches that
	// race for the same runs cannot deadlock. A row per grant, and last
	// a row with a NULL run id and the stamp, as insertRun's.
	insertRuns = `
WITH ` + lockedStamped7 + `,
ins AS (
    INSERT INTO scheduler_runs
           (run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until)
    SELECT r.run_id, r.job, r.scheduled_at, 'running', r.token, $5, nextval('scheduler_fence_seq'), 1,
           stamp.t, now() + $6 * interval '1 microsecond'
      FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[]) AS r(run_id, job, scheduled_at, token), stamp
     ORDER BY r.run_id
    ON CONFLICT (run_id, scheduled_at) DO NOTHING
    RETURNING run_id, fence, attempt, lease_until
)
SELECT run_id, fence, attempt, lease_until FROM ins
UNION ALL
SELECT NULL, NULL, NULL, t FROM stamp`

	renewRun = `
UPDATE scheduler_runs
   SET lease_until = now() + $3 * interval '1 microsecond'
 WHERE run_id = $1 AND scheduled_at = $4 AND token = $2 AND status = 'running' AND lease_until > now()
RETURNING lease_until`

	// releaseRun is allowed after the lease expired as long as nobody took
	// the run over: the token still matches then. A retry of a release
	// that took effect (same token, same outcome) matches and changes
	// nothing.
	releaseRun = `
UPDATE scheduler_runs
   SET status = $3,
       finished_at = CASE WHEN status <> 'running' THEN finished_at WHEN $4::boolean THEN now() END
 WHERE run_id = $1 AND scheduled_at = $5 AND token = $2 AND (status = 'running' OR status = $3)`

	// abandonRun hands back a grant whose reply never came, or whose
	// caller gave up (see abandonLater): nobody runs it, since its caller
	// was told the claim failed. The row stays, interrupted, so that the
	// next claim takes it over at once. Deleting the row instead would
	// let a takeover that found it a moment before read it gone, and the
	// run done. Its token is cleared, which tells takeOverRun that this
	// attempt never started: the next grant is the same attempt (the
	// schema counts attempts from 1, so the row cannot go back to 0). A
	// lost grant spent an attempt before, and with max_attempts 1 a
	// network blip failed a run that never started (found by an outside
	// review of the same fault in Redlock).
	abandonRun = `
UPDATE scheduler_runs
   SET status = 'interrupted', lease_until = now(), token = ''
 WHERE run_id = $1 AND scheduled_at = $3 AND token = $2 AND status = 'running'`

	// probe is readiness: a write that changes nothing, which the server
	// refuses as it would a claim when the database is read-only (a
	// standby, default_transaction_read_only), the table is missing or
	// the role may not write it. A SELECT 1 passes all of those.
	probe = `UPDATE scheduler_runs SET lease_until = lease_until WHERE false`

	historyColumns = `
SELECT run_id, job, scheduled_at, status, holder, fence, attempt, started_at, lease_until, finished_at
  FROM scheduler_runs`
	// A NULL limit is no limit.
	historyAll = historyColumns + `
 ORDER BY scheduled_at DESC, job LIMIT $1`
	historyJob = historyColumns + `
 WHERE job = $1 ORDER BY scheduled_at DESC LIMIT $2`
	// readHistories answers many jobs' queries in one statement: query
	// i is job $1[i] with limit $2[i] (NULL: none), each read by the same
	// index scan as historyJob, its rows tagged with i. It is the
	// runner's read (the overlap probe, recovery), so it first waits for
	// the grants of those jobs in flight (their buckets, $3) to commit:
	// see lockHead and migration 00005.
	readHistories = `SELECT * FROM scheduler_histories($1, $2, $3)`

	// pruneCutoff is the instant before which finished runs are
	// forgotten, on the database clock, fixed once for the partitions
	// dropped whole and the rows deleted.
	pruneCutoff = `SELECT now() - $1 * interval '1 microsecond'`

	// pruneRuns deletes the rows that dropPartitions left: those of the
	// partitions that also hold runs to keep (the month the cutoff falls
	// in, a month with an interrupted run) and of the DEFAULT partition.
	// It also deletes expired controls (see Controls), in a data-modifying
	// CTE: one statement, whose count is the runs'.
	pruneRuns = `
WITH expired_controls AS (
    DELETE FROM scheduler_controls WHERE expires_at <= now()
)
DELETE FROM scheduler_runs WHERE finished_at < $1`
)

// Options configure a Claimer.
type Options struct {
	// Instance is the holder id written into claims.
	Instance string
	// Leases, if set, is the pool Renew and Release use, so that keeping
	// a lease and ending a run never queue behind claims and history
	// reads for a connection of the main pool: on a slow link (900 ms
	// round trips) four connections are busy with those, a renewal waits
	// its turn past the trust window, and a finished run's lease lapses
	// and is taken over. LeasePool builds one. Nil uses the main pool.
	Leases *pgxpool.Pool
}

// Tune sets what a pool the claimer uses needs beyond its DSN's settings:
// READ COMMITTED, commits flushed before they are acknowledged, and a connection is pinged before use only once it has been idle for a
// minute (pgxpool's default is a second). A claim or a renewal comes
// every few seconds per pool at most, so the default pinged before nearly
// every one, a round trip more on each: on a 900ms link that alone put
// claims past their timeout, and renewals and releases past the lease. A
// ping finds a connection the server closed; one that went dead silently
// hangs a ping as it does the statement, until the caller's deadline.
// Without it, a closed connection fails the statement, which the runner
// retries.
func Tune(c *pgxpool.Config) {
	// The history read waits for grants in flight and then reads with a
	// fresh snapshot (scheduler_histories): only READ COMMITTED takes one
	// per statement inside a function; under a database's default of
	// REPEATABLE READ it would read with the snapshot of its call, taken
	// before the wait, and miss the grant it waited for.
	c.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
	// A grant or a release must be on disk before it is acknowledged:
	// under synchronous_commit off (a common tuning, set on a database or
	// a role) a server crash loses the last commits it acknowledged, and a
	// run whose release was lost is taken over and run again (an outside
	// review: 3 finished runs executed again in 3 crashes). The session's
	// setting wins over the database's and the role's; a DSN's off too.
	// Every other value waits for the local flush at least.
	if v := c.ConnConfig.RuntimeParams["synchronous_commit"]; v == "" || v == "off" {
		c.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	}
	if c.ShouldPing == nil {
		c.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool { return p.IdleDuration > time.Minute }
	}
}

// LeasePool returns the configuration of a pool for Options.Leases, made
// from the main pool's: up to max(2, MaxConns/2) connections, one of them
// kept idle and open in the background. A renewal or release that has to
// connect first pays the set-up's round trips (two at least, more with
// TLS) inside its lease: at 800ms round trips on a 3s lease, a replica's
// first renewals and releases, and every one after a timeout had closed
// the connection, landed after the lease ended, and finished runs were
// taken over and run again. The idle connection costs each replica one
// of the server's max_connections.
//
// Its statements go out in one round trip each (QueryExecModeExec), unless
// the DSN chose a mode: pgx's default prepares each statement on each new
// connection first, a round trip more on a replica's first renewal and
// first release, and on every one after a connection was replaced. The
// server parses the two short statements anew each time instead, which
// renewals every lease/3 per running run do not notice.
func LeasePool(main *pgxpool.Config) *pgxpool.Config {
	c := main.Copy()
	c.MaxConns = max(2, main.MaxConns/2)
	c.MinConns = 0
	c.MinIdleConns = 1
	if !strings.Contains(main.ConnString(), "default_query_exec_mode") {
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	return c
}

// Claimer grants claims through rows of the scheduler_runs table. It is safe
// for concurrent use.
type Claimer struct {
	pool       *pgxpool.Pool
	leases     *pgxpool.Pool // Renew and Release: pool unless Options.Leases
	instance   string
	owned      bool // Close closes pool and leases
	parts      *partitions
	undos      claim.Stragglers // abandonLater's, which Close waits for
	closing    chan struct{}    // closed by Close: abandonLater waits no more
	close      sync.Once
	watch      *claim.FenceWatch
	unanswered claim.Unanswered // takeovers held back after unanswered writes (hold.go)
	unseen     claim.Unseen     // grants whose replies were lost, and maybe their hand-backs
}

var _ claim.Claimer = (*Claimer)(nil)

// New returns a Claimer on pool (and opts.Leases), whose connections must
// see the migrated schema (search_path). Close closes neither: their owner
// does.
func New(pool *pgxpool.Pool, opts Options) *Claimer {
	if pool == nil {
		panic("postgres: nil pool")
	}
	leases := opts.Leases
	if leases == nil {
		leases = pool
	}
	cc := pool.Config().ConnConfig
	where := fmt.Sprintf("the database %s on %s", cc.Database, net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))))
	c := &Claimer{pool: pool, leases: leases, instance: opts.Instance, parts: &partitions{pool: pool}, closing: make(chan struct{}),
		watch: claim.NewFenceWatch(where, "a backup restored under running replicas, or another server answering?"+
			" before replicas start again, set scheduler_fence_seq above every fence handed out")}
	c.unanswered.Start()
	return c
}

// Open builds a pool for dsn, and a lease pool beside it unless
// opts.Leases is set, and returns a Claimer that closes them on Close.
// It does not connect: an unreachable server shows up as ErrUnavailable from
// the first call, so a replica can start while its database is down. Errors
// never contain the DSN's password.
func Open(ctx context.Context, dsn string, opts Options) (*Claimer, error) {
	cfg, err := pgxpool.ParseConfig(dsn) // its errors redact the password
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	Tune(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", translate(err))
	}
	if opts.Leases == nil {
		leases, err := pgxpool.NewWithConfig(ctx, LeasePool(cfg))
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres: %w", translate(err))
		}
		opts.Leases = leases
	}
	c := New(pool, opts)
	c.owned = true
	return c, nil
}

// claimOne is Claim for a single run, in plain statements rather than
// arrays: the first round trip inserts the run's row; only if it exists does
// a second one try to take it over.
func (c *Claimer) claimOne(ctx context.Context, run claim.Run, lease time.Duration) (*claim.Claim, error) {
	run.At = run.At.UTC()
	id := run.ID()
	cl := &claim.Claim{Run: run, Token: claim.NewToken(), Holder: c.instance, Lease: lease}

	cl.Requested = time.Now()
	buckets := []int32{bucketOf(run.Job)}
	var (
		fence   *int64
		attempt *int
		until   *time.Time
		stamp   time.Time
	)
	err := c.pool.QueryRow(ctx, insertRun, id, run.Job, run.At, cl.Token, c.instance, lease.Microseconds(), buckets).
		Scan(&fence, &attempt, &until, &stamp)
	granted := err == nil && fence != nil
	c.wrote(ctx, err, granted)
	switch {
	case granted:
		cl.Fence, cl.Attempt, cl.Deadline = *fence, *attempt, until.UTC()
		return cl, nil
	case err != nil:
		c.abandonIfUnknown(err, []*claim.Claim{cl})
		return nil, fmt.Errorf("claim %s: %w", id, translate(err))
	}
	// Only a bid that may take a lease over counts its insert's wait: a
	// fresh grant answered late took nothing from anyone, and counted,
	// it held this replica's retries (takeovers of their own runs) for a
	// lease whenever a loaded machine answered a claim late (CI, stop 69).
	hold, by := c.waited(cl.Requested, lease), takeoverBy(stamp, cl.Requested, lease)

	cl.Requested = time.Now()
	row := c.pool.QueryRow(ctx, takeOverRun, id, cl.Token, c.instance, lease.Microseconds(), run.At, buckets, hold, by, c.unseenToken(id))
	got, wrote, err := takenOver(cl, row)
	c.wrote(ctx, unwrapAnswer(err), wrote)
	c.waited(cl.Requested, lease)
	if err != nil && !errors.Is(err, claim.ErrHeld) && !errors.Is(err, claim.ErrDone) {
		c.abandonIfUnknown(err, []*claim.Claim{cl})
	}
	return got, err
}

// unwrapAnswer is nil for the claim contract's answers to a bid (held,
// done), which the server gave without an error, and err otherwise.
func unwrapAnswer(err error) error {
	if errors.Is(err, claim.ErrHeld) || errors.Is(err, claim.ErrDone) {
		return nil
	}
	return err
}

// abandonIfUnknown hands back, on a goroutine of its own (abandonLater),
// what a claim statement that failed with err may have granted to cls:
// unless the server answered err (the statement failed, and its implicit
// transaction with it) or pgx never sent the statement, the grant may
// have been made and its reply lost (a dropped connection, a timeout, a
// caller whose context ended mid-statement, a backend terminated after
// its commit, whose FATAL came in place of the reply). Left alone, it
// would hold its runs for a whole lease with nobody to run them.
func (c *Claimer) abandonIfUnknown(err error, cls []*claim.Claim) {
	c.failed(err)
	var (
		pgErr      *pgconn.PgError
		connectErr *pgconn.ConnectError
	)
	answered := errors.As(err, &pgErr) && pgErr.Severity != "FATAL" && pgErr.Severity != "PANIC"
	if len(cls) == 0 || answered || errors.As(err, &connectErr) || pgconn.SafeToRetry(err) {
		return
	}
	// The hand-back may be lost too: the next claim of each run takes
	// its grant, if it stands (takeOverRun's $9).
	for _, cl := range cls {
		c.unseen.Note(cl.ID(), cl.Token, time.Now().Add(cl.Lease))
	}
	c.abandonLater(cls)
}

// unseenToken is takeOverRun's $9 for the run with id runID.
func (c *Claimer) unseenToken(runID string) string {
	if token, ok := c.unseen.Take(runID); ok {
		return token
	}
	return ""
}

// failed looks at an error of a statement for what the pools must do
// about it. A read-only transaction (25006) comes from a server that
// became a standby (a failover behind the same address) or a database
// set read-only: both are settings a connection keeps for its life (an
// hour, by pgxpool's default), so every pooled connection is closed, and
// the next statements connect anew, to the new primary or under the
// restored setting.
func (c *Claimer) failed(err error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "25006" {
		c.pool.Reset()
		if c.leases != c.pool {
			c.leases.Reset()
		}
	}
}

// leasesReady reports whether the lease pool holds a connection or can
// open one. Claims are refused (unavailable) until it can: a replica that
// wins runs it cannot renew or release (a server out of connections for
// the pool opened second) would have every one of them run again once
// its lease ends.
func (c *Claimer) leasesReady(ctx context.Context) error {
	if c.leases == c.pool || c.leases.Stat().TotalConns() > 0 {
		return nil
	}
	conn, err := c.leases.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("the lease pool (renewals, releases) cannot connect: %w", translate(err))
	}
	conn.Release()
	return nil
}

// abandonLater runs abandonRun for cls, in run id order (the order
// claims lock rows in), in one implicit transaction on the main pool (the
// lease pool is kept for renewals and releases), detached from the
// caller, who has its answer already. It runs it again for the grants not
// yet found, a few times, up to abandonTimeout: a statement whose caller
// stopped waiting may still be on its way, or queued on the server, when
// the first hand-back finds no row of its token; a token is the lost grant's alone, so a later one
// changes nothing but that grant. A statement that lands later still
// grants all the same; its lease then bounds the hold, as before.
func (c *Claimer) abandonLater(cls []*claim.Claim) {
	cls = slices.Clone(cls)
	slices.SortFunc(cls, func(a, b *claim.Claim) int { return strings.Compare(a.ID(), b.ID()) })
	c.undos.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
		defer cancel()
		for _, wait := range []time.Duration{0, 100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second} {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-c.closing:
				t.Stop()
			case <-t.C:
			}
			b := &pgx.Batch{}
			for _, cl := range cls {
				b.Queue(abandonRun, cl.ID(), cl.Token, cl.Run.At)
			}
			// Best effort: the lease bounds the rest. A grant handed back
			// is done with; the rest are tried again (their statements
			// may still land, or never did).
			res := c.pool.SendBatch(ctx, b)
			left := cls[:0:0]
			for _, cl := range cls {
				if tag, err := res.Exec(); err != nil || tag.RowsAffected() == 0 {
					left = append(left, cl)
				}
			}
			if res.Close() != nil {
				left = cls // not committed: none was handed back
			}
			if cls = left; len(cls) == 0 {
				return
			}
		}
	})
}

// abandonTimeout bounds a hand-back of grants whose replies were lost,
// and so Close, which waits for them.
const abandonTimeout = 5 * time.Second

// takenOver reads takeOverRun's answer for cl, and whether the statement
// wrote the run's row (granted, or touched under the hold).
func takenOver(cl *claim.Claim, row pgx.Row) (*claim.Claim, bool, error) {
	var (
		granted, touched bool
		status           claim.Status
	)
	id := cl.ID()
	err := row.Scan(&granted, &cl.Fence, &cl.Attempt, &cl.Deadline, &status, &touched)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// The row existed a moment ago and only Prune deletes rows, and
		// only finished ones. (Creating a month's partition moves rows out
		// of the DEFAULT partition, under an exclusive lock on the table
		// that this statement waits for before it takes its snapshot.)
		return nil, false, fmt.Errorf("claim %s: %w", id, claim.ErrDone)
	case err != nil:
		return nil, false, fmt.Errorf("claim %s: %w", id, translate(err))
	case granted:
		cl.Deadline = cl.Deadline.UTC()
		return cl, true, nil
	case !status.Live():
		return nil, touched, fmt.Errorf("claim %s: %w", id, claim.ErrDone)
	default:
		return nil, touched, fmt.Errorf("claim %s: %w", id, claim.ErrHeld)
	}
}

// Claim implements claim.Claimer in two round trips: one multi-row insert
// for every run, then, pipelined, the takeover statement for each run that
// already had a row. The second round runs in one implicit transaction
// whose row locks are taken in run id order, like the first's.
func (c *Claimer) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	if err := c.watch.Err(); err != nil {
		errs := make([]error, len(runs))
		for i, run := range runs {
			errs[i] = fmt.Errorf("claim %s: %w", run.ID(), err)
		}
		return make([]*claim.Claim, len(runs)), errs
	}
	mark := c.watch.Mark()
	claims, errs := c.claim(ctx, runs, lease)
	var fences []int64
	for _, cl := range claims {
		if cl != nil {
			fences = append(fences, cl.Fence)
		}
	}
	if err := c.watch.Granted(mark, fences...); err != nil {
		// Granted by a backend that forgot what it granted before: the
		// run may be some replica's still. The rows lapse by themselves.
		for i, cl := range claims {
			if cl != nil {
				claims[i], errs[i] = nil, fmt.Errorf("claim %s: %w", cl.ID(), err)
			}
		}
	}
	return claims, errs
}

// Lost is closed once the database went back in time (claim.FenceWatch):
// `scheduler run` exits 1 then, for its supervisor to restart it.
func (c *Claimer) Lost() <-chan struct{} { return c.watch.Lost() }

// LostErr says why Lost was closed.
func (c *Claimer) LostErr() error { return c.watch.Err() }

func (c *Claimer) claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	c.parts.look()
	claims, errs := make([]*claim.Claim, len(runs)), make([]error, len(runs))
	if err := c.leasesReady(ctx); err != nil {
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
	failAll := func(pending []int, err error) ([]*claim.Claim, []error) {
		for _, i := range pending {
			errs[i] = fmt.Errorf("claim %s: %w", runs[i].ID(), err)
		}
		return claims, errs
	}
	byID := make(map[string]int, len(runs))
	var pending []int
	for i, run := range runs {
		if errs[i] = claim.CheckClaim(run, lease); errs[i] != nil {
			continue
		}
		run.At = run.At.UTC()
		claims[i] = &claim.Claim{Run: run, Token: claim.NewToken(), Holder: c.instance, Lease: lease}
		byID[run.ID()] = i
		pending = append(pending, i)
	}
	slices.SortFunc(pending, func(a, b int) int { return strings.Compare(claims[a].ID(), claims[b].ID()) })
	ids, jobs, ats, tokens := make([]string, len(pending)), make([]string, len(pending)),
		make([]time.Time, len(pending)), make([]string, len(pending))
	buckets := make([]int32, len(pending))
	for k, i := range pending {
		ids[k], jobs[k], ats[k], tokens[k] = claims[i].ID(), claims[i].Run.Job, claims[i].Run.At, claims[i].Token
		buckets[k] = bucketOf(jobs[k])
	}
	if len(pending) == 0 {
		return claims, errs
	}

	sent := make([]*claim.Claim, len(pending))
	for k, i := range pending {
		sent[k] = claims[i]
	}
	requested := time.Now()
	rows, err := c.pool.Query(ctx, insertRuns, ids, jobs, ats, tokens, c.instance, lease.Microseconds(), buckets)
	if err != nil {
		c.wrote(ctx, err, false)
		c.abandonIfUnknown(err, sent)
		clear(claims)
		return failAll(pending, translate(err))
	}
	won := make([]bool, len(runs))
	var (
		scanErr error
		stamp   time.Time
	)
	for scanErr == nil && rows.Next() {
		var (
			id    *string
			fence *int64
			att   *int
			until time.Time
		)
		if scanErr = rows.Scan(&id, &fence, &att, &until); scanErr != nil {
			break
		}
		if id == nil {
			stamp = until // the statement's stamp, its last row
			continue
		}
		if i, ok := byID[*id]; ok {
			won[i] = true
			claims[i].Fence, claims[i].Attempt, claims[i].Deadline, claims[i].Requested = *fence, *att, until.UTC(), requested
		}
	}
	rows.Close()
	if scanErr == nil && rows.Err() == nil && stamp.IsZero() {
		scanErr = errors.New("the insert's reply has no stamp")
	}
	if err := cmp.Or(rows.Err(), scanErr); err != nil {
		// The insert failed as a whole: nothing was granted, unless its
		// reply was lost.
		c.wrote(ctx, err, false)
		c.abandonIfUnknown(err, sent)
		clear(claims)
		return failAll(pending, translate(err))
	}
	c.wrote(ctx, nil, slices.Contains(won, true))

	var rest []int
	for _, i := range pending {
		if !won[i] {
			rest = append(rest, i)
		}
	}
	if len(rest) == 0 {
		return claims, errs
	}
	b := &pgx.Batch{}
	restBuckets := make([]int32, len(rest))
	for k, i := range rest {
		restBuckets[k] = bucketOf(claims[i].Run.Job)
	}
	b.Queue(lockJobs, restBuckets)
	hold, by := c.waited(requested, lease), takeoverBy(stamp, requested, lease)
	for k, i := range rest {
		b.Queue(takeOverRun, claims[i].ID(), claims[i].Token, c.instance, lease.Microseconds(), claims[i].Run.At, restBuckets[k:k+1], hold, by, c.unseenToken(claims[i].ID()))
	}
	taken := make([]*claim.Claim, len(rest))
	for k, i := range rest {
		taken[k] = claims[i]
	}
	requested = time.Now()
	res := c.pool.SendBatch(ctx, b)
	var locked int64
	lockErr := res.QueryRow().Scan(&locked)
	wrote := false
	for _, i := range rest {
		cl := claims[i]
		cl.Requested = requested
		var w bool
		claims[i], w, errs[i] = takenOver(cl, res.QueryRow())
		wrote = wrote || w
	}
	err = cmp.Or(res.Close(), lockErr)
	for _, i := range rest {
		if e := unwrapAnswer(errs[i]); err == nil && e != nil {
			err = e
		}
	}
	c.wrote(ctx, err, wrote)
	c.waited(requested, lease)
	if err != nil {
		// The round's transaction did not commit: none of its takeovers
		// stand, whatever each statement said. Unless it did and the
		// reply was lost: then what it granted is handed back.
		c.abandonIfUnknown(err, taken)
		for _, i := range rest {
			if errs[i] == nil {
				claims[i], errs[i] = nil, fmt.Errorf("claim %s: %w", runs[i].ID(), translate(err))
			}
		}
	}
	return claims, errs
}

// Renew implements claim.Claimer.
func (c *Claimer) Renew(ctx context.Context, cl *claim.Claim, lease time.Duration) error {
	if err := claim.CheckRenew(cl, lease); err != nil {
		return err
	}
	requested := time.Now()
	var deadline time.Time
	err := c.leases.QueryRow(ctx, renewRun, cl.ID(), cl.Token, lease.Microseconds(), cl.Run.At).Scan(&deadline)
	c.wrote(ctx, err, err == nil)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("renew %s: %w", cl.ID(), claim.ErrLeaseLost)
	case err != nil:
		c.failed(err)
		return fmt.Errorf("renew %s: %w", cl.ID(), translate(err))
	}
	cl.Deadline, cl.Requested, cl.Lease = deadline.UTC(), requested, lease
	return nil
}

// releaseOne is Release for a single claim, in one plain statement.
func (c *Claimer) releaseOne(ctx context.Context, cl *claim.Claim, o claim.Status) error {
	tag, err := c.leases.Exec(ctx, releaseRun, cl.ID(), cl.Token, string(o), o.Terminal(), cl.Run.At)
	c.wrote(ctx, err, err == nil && tag.RowsAffected() > 0)
	switch {
	case err != nil:
		c.failed(err)
		return fmt.Errorf("release %s: %w", cl.ID(), translate(err))
	case tag.RowsAffected() == 0:
		return fmt.Errorf("release %s: %w", cl.ID(), claim.ErrLeaseLost)
	}
	return nil
}

// Release implements claim.Claimer: the release statement for every
// claim, pipelined in one round trip and one implicit transaction, in run
// id order, the order Claim locks rows in, so that batches racing over the
// same rows cannot deadlock.
func (c *Claimer) Release(ctx context.Context, cls []*claim.Claim, outcomes []claim.Status) []error {
	errs, pending := claim.CheckReleaseBatch(cls, outcomes)
	switch len(pending) {
	case 0:
		return errs
	case 1:
		errs[pending[0]] = c.releaseOne(ctx, cls[pending[0]], outcomes[pending[0]])
		return errs
	}
	slices.SortFunc(pending, func(a, b int) int { return strings.Compare(cls[a].ID(), cls[b].ID()) })
	b := &pgx.Batch{}
	for _, i := range pending {
		o := outcomes[i]
		b.Queue(releaseRun, cls[i].ID(), cls[i].Token, string(o), o.Terminal(), cls[i].Run.At)
	}
	res := c.leases.SendBatch(ctx, b)
	var (
		changed bool
		failed  error // a statement's own error, which Close may not repeat
	)
	for _, i := range pending {
		tag, err := res.Exec()
		if err == nil && tag.RowsAffected() == 0 {
			err = claim.ErrLeaseLost
		}
		changed = changed || err == nil
		if err != nil && !errors.Is(err, claim.ErrLeaseLost) {
			failed = cmp.Or(failed, err)
		}
		errs[i] = err
	}
	err := res.Close()
	c.wrote(ctx, cmp.Or(err, failed), changed && err == nil && failed == nil)
	if err != nil {
		// The transaction did not commit: none of its releases stand.
		c.failed(err)
		for _, i := range pending {
			errs[i] = err
		}
	}
	for _, i := range pending {
		if err := errs[i]; err != nil {
			if !errors.Is(err, claim.ErrLeaseLost) {
				err = translate(err)
			}
			errs[i] = fmt.Errorf("release %s as %s: %w", cls[i].ID(), outcomes[i], err)
		}
	}
	return errs
}

// Ping implements claim.Claimer.
// Both pools must connect and take a write (probe): claims need the
// one, renewals and releases the other.
func (c *Claimer) Ping(ctx context.Context) error {
	if err := c.refusal(); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	if _, err := c.pool.Exec(ctx, probe); err != nil {
		c.failed(err)
		return fmt.Errorf("ping: %w", translate(err))
	}
	if c.leases != c.pool {
		if _, err := c.leases.Exec(ctx, probe); err != nil {
			c.failed(err)
			return fmt.Errorf("ping: the lease pool (renewals, releases): %w", translate(err))
		}
	}
	return nil
}

// Close implements claim.Claimer. It waits for a partition look in flight
// (cancelled), then closes the pools only if Open built them.
func (c *Claimer) Close() error {
	c.parts.close()
	c.close.Do(func() { close(c.closing) })
	c.undos.Wait()
	if c.owned {
		c.pool.Close()
		if c.leases != c.pool {
			c.leases.Close()
		}
	}
	return nil
}

// History implements claim.Claimer: runs newest scheduled instant first,
// of job or, if job is "", of every job; limit <= 0 means no limit.
func (c *Claimer) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	var lim *int
	if limit > 0 {
		lim = &limit
	}
	var (
		rows pgx.Rows
		err  error
	)
	if job == "" {
		rows, err = c.pool.Query(ctx, historyAll, lim)
	} else {
		rows, err = c.pool.Query(ctx, historyJob, job, lim)
	}
	if err != nil {
		return nil, fmt.Errorf("history: %w", translate(err))
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claim.Record, error) {
		var r claim.Record
		return r, scanRecord(row, &r)
	})
	if err != nil {
		return nil, fmt.Errorf("history: %w", translate(err))
	}
	return recs, nil
}

var _ claim.Historian = (*Claimer)(nil)

// Histories implements claim.Historian: one statement for every query
// (readHistories), which sees every grant of their jobs stamped before
// it reads.
func (c *Claimer) Histories(ctx context.Context, qs []claim.HistoryQuery) ([][]claim.Record, error) {
	jobs, limits, buckets := make([]string, len(qs)), make([]*int32, len(qs)), make([]int32, len(qs))
	for i, q := range qs {
		jobs[i], buckets[i] = q.Job, bucketOf(q.Job)
		if q.Limit > 0 {
			l := int32(min(q.Limit, math.MaxInt32))
			limits[i] = &l
		}
	}
	rows, err := c.pool.Query(ctx, readHistories, jobs, limits, buckets)
	if err != nil {
		return nil, fmt.Errorf("history: %w", translate(err))
	}
	defer rows.Close()
	hists := make([][]claim.Record, len(qs))
	for rows.Next() {
		var (
			i int64 // WITH ORDINALITY counts from 1
			r claim.Record
		)
		if err := scanRecord(rows, &r, &i); err != nil {
			return nil, fmt.Errorf("history: %w", translate(err))
		}
		hists[i-1] = append(hists[i-1], r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("history: %w", translate(err))
	}
	return hists, nil
}

// buckets is how many locks the jobs share (lockHead): few enough that a
// claim of every job of a large fleet takes a few hundred locks, not one
// per job (PostgreSQL's lock table holds 64 per connection by default).
const buckets = 256

// bucketOf is the lock bucket of job: FNV-1a of its name, modulo
// buckets. Every replica must compute it alike; it is not stored.
func bucketOf(job string) int32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(job))
	return int32(h.Sum32() % buckets)
}

// scanRecord reads one history row into r.
func scanRecord(row pgx.Row, r *claim.Record, lead ...any) error {
	var finished *time.Time
	dest := append(lead, &r.RunID, &r.Job, &r.At, &r.Status, &r.Holder, &r.Fence, &r.Attempt,
		&r.StartedAt, &r.LeaseUntil, &finished)
	err := row.Scan(dest...)
	// The id carries the exact instant; the column is rounded to µs.
	if run, perr := claim.ParseID(r.RunID); perr == nil {
		r.At = run.At
	}
	r.At, r.StartedAt, r.LeaseUntil = r.At.UTC(), r.StartedAt.UTC(), r.LeaseUntil.UTC()
	if finished != nil {
		r.FinishedAt = finished.UTC()
	}
	return err
}

// Prune deletes runs that finished (succeeded, failed or skipped) more than
// olderThan ago, on the database clock, and returns how many it deleted. It
// is the retention policy: call it periodically from one place.
//
// A pruned run is forgotten: a replica that later claims the same run would
// be granted it again as attempt 1. olderThan must be at least the longest
// window in which replicas still claim a finished run (config.ClaimWindow
// over every job; `scheduler prune` refuses less).
// Interrupted runs and expired leases are kept: they are not finished, and
// deleting them would lose the attempt count and let a stale run restart.
//
// A month's partition whose runs are all to be forgotten is dropped whole
// (see dropPartitions); the rest are deleted row by row. Either way the
// runs forgotten are exactly those the rule above names.
//
// It also deletes expired controls (see Controls), which are already
// invisible; they do not count in the number returned.
func (c *Claimer) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: prune older than %v", claim.ErrInvalid, olderThan)
	}
	var cutoff time.Time
	if err := c.pool.QueryRow(ctx, pruneCutoff, olderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("prune: %w", translate(err))
	}
	dropped, err := dropPartitions(ctx, c.pool, cutoff)
	if err != nil {
		return 0, fmt.Errorf("prune: %w", translate(err))
	}
	tag, err := c.pool.Exec(ctx, pruneRuns, cutoff)
	if err != nil {
		return dropped, fmt.Errorf("prune: %w", translate(err))
	}
	return dropped + tag.RowsAffected(), nil
}
