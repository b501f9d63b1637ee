-- +goose Up
-- Tables of the shipped billing.nightly job. They live in the configured
-- `database`, which may be an application's own: hence the billing_ prefix.

-- rate_cents is the price of one usage unit, in cents.
CREATE TABLE billing_customers (
    id         bigint PRIMARY KEY,
    name       text   NOT NULL,
    rate_cents bigint NOT NULL CHECK (rate_cents >= 0)
);

-- One usage sample per customer and instant: re-seeding is idempotent.
-- The primary key also serves the per-customer range scan of a period.
CREATE TABLE billing_usage (
    customer_id bigint      NOT NULL REFERENCES billing_customers (id),
    at          timestamptz NOT NULL,
    units       bigint      NOT NULL CHECK (units >= 0),
    PRIMARY KEY (customer_id, at)
);

-- One invoice per (customer, period), enforced by the primary key, whatever
-- the number of runs, takeovers or replicas. fence is the highest fence that
-- wrote the row: an upsert carrying a lower one changes nothing (see
-- internal/billing). written_by is the writer's instance id.
CREATE TABLE billing_invoices (
    customer_id  bigint      NOT NULL REFERENCES billing_customers (id),
    period_start timestamptz NOT NULL,
    period_end   timestamptz NOT NULL CHECK (period_end > period_start),
    amount_cents bigint      NOT NULL CHECK (amount_cents >= 0),
    fence        bigint      NOT NULL,
    written_by   text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT billing_invoices_one_per_period PRIMARY KEY (customer_id, period_start)
);

-- Listing one period's invoices.
CREATE INDEX billing_invoices_period_start_idx ON billing_invoices (period_start);

-- +goose Down
DROP TABLE billing_invoices;
DROP TABLE billing_usage;
DROP TABLE billing_customers;
