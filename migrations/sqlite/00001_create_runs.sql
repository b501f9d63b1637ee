-- +goose Up
-- A one-row counter hands out fences: a grant writes value + 1 and the
-- triggers below advance the counter in the same statement's transaction.
-- IF NOT EXISTS because Down keeps it (see below).
CREATE TABLE IF NOT EXISTS scheduler_fence (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    value INTEGER NOT NULL
) STRICT;
INSERT OR IGNORE INTO scheduler_fence (id, value) VALUES (1, 0);

-- One row per run. Times are integer unix milliseconds taken from SQLite's
-- clock, so every process on the host measures leases the same way. status
-- is one of claim.Status (running, interrupted, succeeded, failed, skipped);
-- no CHECK, so a new status needs no table rewrite.
CREATE TABLE scheduler_runs (
    run_id       TEXT    PRIMARY KEY,
    job          TEXT    NOT NULL,
    scheduled_at INTEGER NOT NULL,
    status       TEXT    NOT NULL,
    token        TEXT    NOT NULL,
    holder       TEXT    NOT NULL,
    fence        INTEGER NOT NULL,
    attempt      INTEGER NOT NULL CHECK (attempt >= 1),
    started_at   INTEGER NOT NULL,
    lease_until  INTEGER NOT NULL,
    finished_at  INTEGER
) STRICT, WITHOUT ROWID;

-- History of one job, newest first; and of every job (status page).
CREATE INDEX scheduler_runs_job_scheduled_at_idx ON scheduler_runs (job, scheduled_at DESC);
CREATE INDEX scheduler_runs_scheduled_at_idx ON scheduler_runs (scheduled_at DESC);
-- Retention deletes finished runs by age.
CREATE INDEX scheduler_runs_finished_at_idx ON scheduler_runs (finished_at)
    WHERE finished_at IS NOT NULL;

-- +goose StatementBegin
CREATE TRIGGER scheduler_runs_fence_insert AFTER INSERT ON scheduler_runs
BEGIN
    UPDATE scheduler_fence SET value = NEW.fence WHERE id = 1 AND value < NEW.fence;
END;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE TRIGGER scheduler_runs_fence_update AFTER UPDATE OF fence ON scheduler_runs
BEGIN
    UPDATE scheduler_fence SET value = NEW.fence WHERE id = 1 AND value < NEW.fence;
END;
-- +goose StatementEnd

-- +goose Down
DROP TABLE scheduler_runs;
-- scheduler_fence is kept on purpose: fenced storage remembers fences, so a
-- down/up cycle that restarted the counter at 0 would get every later
-- holder's writes rejected.
