-- +goose Up
-- Tables of the shipped billing.nightly job, in the configured `database`
-- (by default the claimer's file): hence the billing_ prefix. Times are
-- integer unix milliseconds, UTC, as in scheduler_runs.

-- rate_cents is the price of one usage unit, in cents.
CREATE TABLE billing_customers (
    id         INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    rate_cents INTEGER NOT NULL CHECK (rate_cents >= 0)
) STRICT;

-- One usage sample per customer and instant: re-seeding is idempotent.
-- The primary key also serves the per-customer range scan of a period.
CREATE TABLE billing_usage (
    customer_id INTEGER NOT NULL REFERENCES billing_customers (id),
    at          INTEGER NOT NULL,
    units       INTEGER NOT NULL CHECK (units >= 0),
    PRIMARY KEY (customer_id, at)
) STRICT, WITHOUT ROWID;

-- One invoice per (customer, period), enforced by the primary key, whatever
-- the number of runs, takeovers or replicas. fence is the highest fence that
-- wrote the row: an upsert carrying a lower one changes nothing (see
-- internal/billing). written_by is the writer's instance id.
CREATE TABLE billing_invoices (
    customer_id  INTEGER NOT NULL REFERENCES billing_customers (id),
    period_start INTEGER NOT NULL,
    period_end   INTEGER NOT NULL CHECK (period_end > period_start),
    amount_cents INTEGER NOT NULL CHECK (amount_cents >= 0),
    fence        INTEGER NOT NULL,
    written_by   TEXT    NOT NULL,
    created_at   INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    updated_at   INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    CONSTRAINT billing_invoices_one_per_period PRIMARY KEY (customer_id, period_start)
) STRICT, WITHOUT ROWID;

-- Listing one period's invoices.
CREATE INDEX billing_invoices_period_start_idx ON billing_invoices (period_start);

-- +goose Down
DROP TABLE billing_invoices;
DROP TABLE billing_usage;
DROP TABLE billing_customers;
