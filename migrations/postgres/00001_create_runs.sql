-- +goose Up
-- Fences come from one global sequence: strictly increasing over every grant,
-- hence over every grant of one job, and durable across server restarts.
-- IF NOT EXISTS because Down keeps it (see below).
CREATE SEQUENCE IF NOT EXISTS scheduler_fence_seq;

-- One row per run; a replica wins a run by inserting its row.
-- Times are on the database clock, never a replica's. status is one of
-- claim.Status (running, interrupted, succeeded, failed, skipped); no CHECK,
-- so a new status needs no table rewrite.
CREATE TABLE scheduler_runs (
    run_id       text        PRIMARY KEY,
    job          text        NOT NULL,
    scheduled_at timestamptz NOT NULL,
    status       text        NOT NULL,
    token        text        NOT NULL,
    holder       text        NOT NULL,
    fence        bigint      NOT NULL,
    attempt      integer     NOT NULL CHECK (attempt >= 1),
    started_at   timestamptz NOT NULL,
    lease_until  timestamptz NOT NULL,
    finished_at  timestamptz
);

-- History of one job, newest first; and of every job (status page).
CREATE INDEX scheduler_runs_job_scheduled_at_idx ON scheduler_runs (job, scheduled_at DESC);
CREATE INDEX scheduler_runs_scheduled_at_idx ON scheduler_runs (scheduled_at DESC);
-- Retention deletes finished runs by age.
CREATE INDEX scheduler_runs_finished_at_idx ON scheduler_runs (finished_at)
    WHERE finished_at IS NOT NULL;

-- +goose Down
DROP TABLE scheduler_runs;
-- scheduler_fence_seq is kept on purpose: fenced storage remembers fences, so
-- a down/up cycle that restarted the sequence at 1 would get every later
-- holder's writes rejected.
