-- +goose Up
-- Nothing to do: PostgreSQL's 00005 makes a history read wait for the
-- grants of its jobs in flight. On SQLite a claim's transaction holds the
-- file's write lock until it commits, so no other replica's claim, and
-- hence no probe that follows one, gets ahead of an uncommitted grant.
-- The empty migration keeps both dialects' versions in step.

-- +goose Down
