-- +goose Up
-- The operator's state (claim.Controls: pauses, run requests), one row per
-- key. It lives beside scheduler_runs, in the same file, so every process
-- that shares the runs sees the same pauses and requests. value is opaque to
-- the database. version orders the writes of a key: the highest stays, but
-- an entry written with first (1) stays whatever comes after it, until it
-- expires. expires_at is integer unix milliseconds on SQLite's clock, as in
-- scheduler_runs; NULL means never. Keys compare bytewise (BINARY), as Go
-- strings do.
CREATE TABLE scheduler_controls (
    key        TEXT    PRIMARY KEY,
    value      BLOB    NOT NULL,
    version    INTEGER NOT NULL,
    first      INTEGER NOT NULL CHECK (first IN (0, 1)),
    expires_at INTEGER
) STRICT, WITHOUT ROWID;

-- +goose Down
DROP TABLE scheduler_controls;
