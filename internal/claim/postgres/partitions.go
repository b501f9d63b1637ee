package postgres

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// scheduler_runs is partitioned by month of scheduled_at, with a DEFAULT
// partition for any instant no month covers (migration 00004 says why
// monthly). Claims, renewals and releases name the run's instant, so each
// touches one month's partition whatever the history behind it. The claimer
// keeps partitions created ahead of the runs that will need them; Prune
// drops the months whose runs are all to be forgotten.
const (
	// partitionsAhead is how many months past the database's current one
	// have a partition; migration 00004 creates the same. A replica that
	// keeps running creates the next month's three months early.
	partitionsAhead = 3
	// partitionLookEvery is how often a claimer checks that the months
	// ahead have partitions (one catalog lookup per month when they do);
	// after a failure it tries again after partitionRetry.
	partitionLookEvery = time.Hour
	partitionRetry     = time.Minute
	// partitionLookTimeout bounds one look, lock wait included.
	partitionLookTimeout = 30 * time.Second

	// ddlLockTimeout bounds the wait for the exclusive lock on
	// scheduler_runs that creating or dropping a partition takes. While it
	// waits (behind a long query, say) every claim queues behind it, so it
	// gives up soon: creation is tried again later, and Prune deletes the
	// rows instead.
	ddlLockTimeout = `SET LOCAL lock_timeout = '1s'`

	// createPartitions creates the partitions missing from the current
	// month to partitionsAhead months on (migration 00004 defines the
	// function).
	createPartitions = `SELECT scheduler_runs_create_partitions(now(), now() + $1 * interval '1 month')`

	// oldPartitions lists the range partitions of scheduler_runs whose
	// upper bound is at or before $1, oldest first, as qualified names.
	// The bound is read back from its text: both directions use the
	// session's time zone and date style. MAXVALUE, and the DEFAULT
	// partition, have no quoted upper bound and are never listed.
	oldPartitions = `
SELECT format('%I.%I', n.nspname, c.relname)
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)') AS b(upper)
 WHERE i.inhparent = 'scheduler_runs'::regclass AND b.upper[1]::timestamptz <= $1
 ORDER BY b.upper[1]::timestamptz`

	// lockRuns holds every claim back while partitions are dropped.
	lockRuns = `LOCK TABLE scheduler_runs IN ACCESS EXCLUSIVE MODE`

	// keepRuns is what Prune keeps: a run not finished (running,
	// interrupted) or finished at or after the cutoff ($1). Both halves
	// are probes of the finished_at index, which holds NULLs.
	keepRuns = `finished_at IS NULL OR finished_at >= $1`
)

// lockNotAvailable is lock_timeout's SQLSTATE.
const lockNotAvailable = "55P03"

// partitions keeps a claimer's look at the months ahead. A claim starts a
// look when partitionLookEvery has passed since the last one, in a
// goroutine of its own that the claimer owns: the claim does not wait for
// it (a claim stays one round trip), and Close cancels it and waits for
// it. A run whose month has no partition yet goes to the DEFAULT
// partition, so a look that fails costs nothing but that.
type partitions struct {
	pool *pgxpool.Pool
	wg   sync.WaitGroup

	mu     sync.Mutex
	next   time.Time          // no look before; zero: at the first claim
	cancel context.CancelFunc // of the look in flight; nil when none
	closed bool
}

// look starts a look if one is due and none is in flight.
func (p *partitions) look() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.cancel != nil || time.Now().Before(p.next) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), partitionLookTimeout)
	p.cancel = cancel
	p.wg.Go(func() {
		err := ensurePartitions(ctx, p.pool)
		cancel()
		p.mu.Lock()
		defer p.mu.Unlock()
		p.cancel = nil
		p.next = time.Now().Add(partitionLookEvery)
		if err != nil {
			p.next = time.Now().Add(partitionRetry)
		}
	})
}

// close cancels a look in flight and waits for it; no look starts after.
func (p *partitions) close() {
	p.mu.Lock()
	p.closed = true
	if p.cancel != nil {
		p.cancel()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// ensurePartitions creates the partitions of the current month and the
// partitionsAhead next ones that are missing.
func ensurePartitions(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, ddlLockTimeout); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, createPartitions, partitionsAhead)
		return err
	})
}

// dropPartitions drops every partition whose whole range lies before
// cutoff and whose runs all finished before it (none running, none
// interrupted, none finished since), and returns how many runs they held:
// exactly the runs Prune's rule forgets, without deleting them one by one.
//
// The look at each partition's runs (a count) is made first, without a
// lock. Then, under an exclusive lock on scheduler_runs that holds claims
// back for as long as it lasts, each partition is looked at again through
// the finished_at index alone, and dropped if it still has nothing to
// keep. A run inserted between the two looks is unfinished, or finished
// after the cutoff, so the second look sees it. If the lock cannot be had
// within ddlLockTimeout, nothing is dropped: Prune's delete then forgets
// the same runs row by row. (Two prunes at once may each count runs the
// other deleted; retention runs from one place.)
func dropPartitions(ctx context.Context, pool *pgxpool.Pool, cutoff time.Time) (int64, error) {
	rows, err := pool.Query(ctx, oldPartitions, cutoff)
	if err != nil {
		return 0, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, err
	}
	type candidate struct {
		name string
		runs int64
	}
	var drop []candidate
	for _, name := range names {
		var runs, keep int64
		// name is quoted by the server (format %I).
		err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE `+keepRuns+`) FROM `+name, cutoff).
			Scan(&runs, &keep)
		if err != nil {
			return 0, err
		}
		if keep == 0 {
			drop = append(drop, candidate{name, runs})
		}
	}
	if len(drop) == 0 {
		return 0, nil
	}
	var dropped int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		dropped = 0
		if _, err := tx.Exec(ctx, ddlLockTimeout); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, lockRuns); err != nil {
			return err
		}
		for _, d := range drop {
			var exists, keep bool
			// Another prune may have dropped it meanwhile.
			if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, d.name).Scan(&exists); err != nil {
				return err
			}
			if !exists {
				continue
			}
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+d.name+` WHERE `+keepRuns+`)`, cutoff).Scan(&keep); err != nil {
				return err
			}
			if keep {
				continue
			}
			if _, err := tx.Exec(ctx, `DROP TABLE `+d.name); err != nil {
				return err
			}
			dropped += d.runs
		}
		return nil
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable {
		return 0, nil
	}
	return dropped, err
}
