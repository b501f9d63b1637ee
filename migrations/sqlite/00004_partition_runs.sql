-- +goose Up
-- Nothing to do: PostgreSQL's 00004 partitions scheduler_runs by month;
-- SQLite has no partitioning, and a file serves one host's runs. The empty
-- migration keeps both dialects' versions in step.

-- +goose Down
