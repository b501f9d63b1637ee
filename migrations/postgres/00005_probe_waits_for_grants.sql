-- +goose Up
-- scheduler_histories is the runner's history read (the overlap probe,
-- start-up recovery): the newest runs of each of jobs, lims[i] of
-- jobs[i] (NULL: all), each row tagged with its query's position i.
--
-- Why a function: a grant is stamped (started_at) by its statement and
-- shown to others only when its transaction commits. A commit that
-- stalls (a synchronous standby, a slow disk) would leave a grant stamped
-- before another replica's probe read, yet invisible to it; the probe
-- orders runs by the stamp, so the stalled run would come first unseen
-- and start beside the run that probed. So every grant takes its job's
-- lock shared, and stamps after it (the claim statements), and this
-- read takes the locks of its jobs exclusively: it waits for the grants
-- of its jobs in flight to commit, and then reads with a snapshot taken
-- after the wait, which a single statement cannot do (its snapshot
-- predates its locks; a function's later statements each take a fresh
-- one, under READ COMMITTED, which the claimer's connections use). It is
-- one statement, so the locks are held for the read alone and a client
-- cut off mid-call strands none.
--
-- The locks are transaction-level advisory locks keyed (23789, bucket):
-- buckets (the job's name hashed by the claimer, 0 to 255) rather than
-- jobs, so that a claim of 10,000 jobs takes at most 256 locks; taken in
-- ascending order by every statement, so that none deadlocks, and after
-- the runs table's lock, as a grant's statement takes that first: a read
-- that held a bucket lock while it queued on the table behind DDL (a
-- partition created, a prune), which waited for a grant, which waited
-- for the bucket, stalled that bucket's claims until PostgreSQL's
-- deadlock check reordered the queue (a second). The read is
-- planned at each call (EXECUTE): a plan cached while the table was empty
-- would scan whole partitions once it filled.
-- +goose StatementBegin
CREATE FUNCTION scheduler_histories(jobs text[], lims integer[], buckets integer[])
RETURNS TABLE (i bigint, run_id text, job text, scheduled_at timestamptz, status text, holder text,
               fence bigint, attempt integer, started_at timestamptz, lease_until timestamptz,
               finished_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  PERFORM 1 FROM scheduler_runs WHERE false;
  PERFORM pg_advisory_xact_lock(23789, b) FROM (SELECT DISTINCT b FROM unnest(buckets) AS b ORDER BY b) AS s;
  RETURN QUERY EXECUTE $q$
SELECT q.i, r.run_id, r.job, r.scheduled_at, r.status, r.holder, r.fence, r.attempt, r.started_at, r.lease_until, r.finished_at
  FROM unnest($1::text[], $2::int[]) WITH ORDINALITY AS q(job, lim, i)
 CROSS JOIN LATERAL (
       SELECT * FROM scheduler_runs
        WHERE scheduler_runs.job = q.job ORDER BY scheduler_runs.scheduled_at DESC LIMIT q.lim) AS r
 ORDER BY q.i, r.scheduled_at DESC$q$ USING jobs, lims;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION scheduler_histories(text[], integer[], integer[]);
