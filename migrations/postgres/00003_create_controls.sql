-- +goose Up
-- The operator's state (claim.Controls: pauses, run requests), one row per
-- key. It lives beside scheduler_runs, in the same schema, so every replica
-- that shares the runs sees the same pauses and requests. value is opaque to
-- the database. version orders the writes of a key: the highest stays, but
-- an entry written with first stays whatever comes after it, until it
-- expires. expires_at is on the database clock; NULL means never. The key
-- sorts and compares bytewise (COLLATE "C"), as Go strings do, for List's
-- prefix range and order.
CREATE TABLE scheduler_controls (
    key        text        COLLATE "C" PRIMARY KEY,
    value      bytea       NOT NULL,
    version    bigint      NOT NULL,
    first      boolean     NOT NULL,
    expires_at timestamptz
);

-- +goose Down
DROP TABLE scheduler_controls;
