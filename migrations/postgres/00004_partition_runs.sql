-- +goose Up
-- scheduler_runs becomes partitioned by scheduled_at, one partition per
-- calendar month (UTC). Claims go to the month of their instant, so a claim
-- costs what it costs on a table holding one month of runs whatever the
-- history behind it, and `scheduler prune` drops a month's partition whole
-- instead of deleting its rows one by one. Monthly rather than daily: the
-- default retention (30 days) then spans two or three partitions, and the
-- queries that cannot prune by instant (history of every job, prune's
-- delete, lookups of a run by id alone) visit a few dozen partitions after
-- years, not hundreds. A month of even 10,000 jobs a minute is about 430
-- million rows; at such a rate a finer granularity is an operator's choice
-- (Prune drops any range partition whose range is old enough, whatever its
-- width).
--
-- Partitions are named scheduler_runs_pYYYY_MM and created ahead by
-- scheduler_runs_create_partitions: here, for every month the existing rows
-- fall in and for the current month and the next three, and then by every
-- replica's claimer (hourly). The DEFAULT partition takes any
-- run no partition covers (an instant years away, a month whose partition
-- was not created yet or was pruned), so a claim never fails for want of a
-- partition; creating ahead keeps it nearly empty.
--
-- The existing table is renamed, the partitioned one created under the old
-- names, the rows copied and the old table dropped, in this migration's one
-- transaction: a replica's claim waits for it and then sees every row, in
-- the new table. Indexes are built after the copy (a bulk build rather
-- than millions of insertions). scheduler_fence_seq is not touched: fences
-- keep growing from where they are.
--
-- A partitioned table's primary key must contain the partition key, so it
-- is (run_id, scheduled_at). The run id is the job and the instant, so the
-- pair is unique exactly when run_id is, and `ON CONFLICT (run_id,
-- scheduled_at)` is the claim's conflict target.
ALTER TABLE scheduler_runs RENAME TO scheduler_runs_unpartitioned;
ALTER INDEX scheduler_runs_pkey RENAME TO scheduler_runs_unpartitioned_pkey;
ALTER INDEX scheduler_runs_job_scheduled_at_idx RENAME TO scheduler_runs_unpartitioned_job_scheduled_at_idx;
ALTER INDEX scheduler_runs_scheduled_at_idx RENAME TO scheduler_runs_unpartitioned_scheduled_at_idx;
ALTER INDEX scheduler_runs_finished_at_idx RENAME TO scheduler_runs_unpartitioned_finished_at_idx;

CREATE TABLE scheduler_runs (
    run_id       text        NOT NULL,
    job          text        NOT NULL,
    scheduled_at timestamptz NOT NULL,
    status       text        NOT NULL,
    token        text        NOT NULL,
    holder       text        NOT NULL,
    fence        bigint      NOT NULL,
    -- Named: the default name is taken by the renamed table's constraint.
    attempt      integer     NOT NULL CONSTRAINT scheduler_runs_attempt_check CHECK (attempt >= 1),
    started_at   timestamptz NOT NULL,
    lease_until  timestamptz NOT NULL,
    finished_at  timestamptz
) PARTITION BY RANGE (scheduled_at);

CREATE TABLE scheduler_runs_default PARTITION OF scheduler_runs DEFAULT;

-- scheduler_runs_create_partitions creates the monthly partition of every
-- month from from_at's to to_at's (UTC) that has none, and returns how many
-- it created. Months that have one cost a catalog lookup and take no lock,
-- so replicas call it often. Creating one locks scheduler_runs exclusively
-- (claims wait, for milliseconds): callers other than migrations set a
-- lock_timeout, so that they give up rather than queue claims behind a long
-- query. Runs of the month that reached the DEFAULT partition meanwhile
-- move into the new partition, which could not be attached otherwise.
-- Names are resolved through search_path at each call, so one definition
-- serves whichever schema it lives in.
-- +goose StatementBegin
CREATE FUNCTION scheduler_runs_create_partitions(from_at timestamptz, to_at timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    parent  regclass := 'scheduler_runs'::regclass;
    nsp     text;
    dflt    regclass;
    m       timestamp := date_trunc('month', from_at AT TIME ZONE 'UTC');
    last_m  timestamp := date_trunc('month', to_at AT TIME ZONE 'UTC');
    part    text;
    lo      timestamptz;
    hi      timestamptz;
    locked  boolean := false;
    created integer := 0;
BEGIN
    SELECT quote_ident(n.nspname) INTO nsp
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = parent;
    WHILE m <= last_m LOOP
        part := nsp || '.' || quote_ident('scheduler_runs_p' || to_char(m, 'YYYY_MM'));
        IF to_regclass(part) IS NOT NULL THEN
            m := m + interval '1 month';
            CONTINUE;
        END IF;
        IF NOT locked THEN
            EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', parent);
            locked := true;
            CONTINUE; -- look again under the lock: another caller may have created it
        END IF;
        lo := m AT TIME ZONE 'UTC';
        hi := (m + interval '1 month') AT TIME ZONE 'UTC';
        EXECUTE format('CREATE TABLE %s (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part, parent);
        SELECT NULLIF(partdefid, 0)::regclass INTO dflt FROM pg_partitioned_table WHERE partrelid = parent;
        IF dflt IS NOT NULL THEN
            EXECUTE format('WITH moved AS (DELETE FROM %s WHERE scheduled_at >= $1 AND scheduled_at < $2 RETURNING *) '
                           'INSERT INTO %s SELECT * FROM moved', dflt, part) USING lo, hi;
        END IF;
        -- Attaching builds the partition's indexes from the parent's.
        EXECUTE format('ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (%L) TO (%L)', parent, part, lo, hi);
        created := created + 1;
        m := m + interval '1 month';
    END LOOP;
    RETURN created;
END
$$;
-- +goose StatementEnd

SELECT scheduler_runs_create_partitions(m AT TIME ZONE 'UTC', m AT TIME ZONE 'UTC')
  FROM (SELECT DISTINCT date_trunc('month', scheduled_at AT TIME ZONE 'UTC') AS m
          FROM scheduler_runs_unpartitioned) AS months;
-- The current month and the next three, as the claimer keeps them
-- (partitionsAhead in internal/claim/postgres).
SELECT scheduler_runs_create_partitions(now(), now() + interval '3 months');

INSERT INTO scheduler_runs
       (run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until, finished_at)
SELECT run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until, finished_at
  FROM scheduler_runs_unpartitioned;
DROP TABLE scheduler_runs_unpartitioned;

ALTER TABLE scheduler_runs ADD CONSTRAINT scheduler_runs_pkey PRIMARY KEY (run_id, scheduled_at);
-- History of one job, newest first; and of every job (status page).
CREATE INDEX scheduler_runs_job_scheduled_at_idx ON scheduler_runs (job, scheduled_at DESC);
CREATE INDEX scheduler_runs_scheduled_at_idx ON scheduler_runs (scheduled_at DESC);
-- Retention deletes finished runs by age; and before it drops a partition
-- whole it looks, under a lock that holds claims back, for a run that is
-- not finished (finished_at IS NULL), so NULLs are indexed too: that look
-- is an index probe, not a scan of the month.
CREATE INDEX scheduler_runs_finished_at_idx ON scheduler_runs (finished_at);
-- Partitioned parents are not analyzed by autovacuum; the planner's
-- estimates for queries on the parent come from here.
ANALYZE scheduler_runs;

-- +goose Down
-- Back to one table, every row kept. The partitioned table's indexes give
-- up their names first (index names are per schema); its partitions go
-- with it.
ALTER TABLE scheduler_runs RENAME TO scheduler_runs_partitioned;
ALTER INDEX scheduler_runs_pkey RENAME TO scheduler_runs_partitioned_pkey;
ALTER INDEX scheduler_runs_job_scheduled_at_idx RENAME TO scheduler_runs_partitioned_job_scheduled_at_idx;
ALTER INDEX scheduler_runs_scheduled_at_idx RENAME TO scheduler_runs_partitioned_scheduled_at_idx;
ALTER INDEX scheduler_runs_finished_at_idx RENAME TO scheduler_runs_partitioned_finished_at_idx;

CREATE TABLE scheduler_runs (
    run_id       text        PRIMARY KEY,
    job          text        NOT NULL,
    scheduled_at timestamptz NOT NULL,
    status       text        NOT NULL,
    token        text        NOT NULL,
    holder       text        NOT NULL,
    fence        bigint      NOT NULL,
    attempt      integer     NOT NULL CONSTRAINT scheduler_runs_attempt_check CHECK (attempt >= 1),
    started_at   timestamptz NOT NULL,
    lease_until  timestamptz NOT NULL,
    finished_at  timestamptz
);
INSERT INTO scheduler_runs
       (run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until, finished_at)
SELECT run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until, finished_at
  FROM scheduler_runs_partitioned;
DROP TABLE scheduler_runs_partitioned;
DROP FUNCTION scheduler_runs_create_partitions(timestamptz, timestamptz);

CREATE INDEX scheduler_runs_job_scheduled_at_idx ON scheduler_runs (job, scheduled_at DESC);
CREATE INDEX scheduler_runs_scheduled_at_idx ON scheduler_runs (scheduled_at DESC);
CREATE INDEX scheduler_runs_finished_at_idx ON scheduler_runs (finished_at)
    WHERE finished_at IS NOT NULL;
