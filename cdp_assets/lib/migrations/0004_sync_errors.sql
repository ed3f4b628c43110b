-- One row per failed Dagster run, written by the `sync_errors_sensor` (cdp_assets/ops/), so
-- failures can be queried per tenant next to the data. Messages are redacted and truncated.
CREATE TABLE cdp.sync_errors (
    sync_error_id bigserial PRIMARY KEY,
    -- The sensor may see a run again (restarted daemon, reset cursor): one row per run.
    run_id        text NOT NULL UNIQUE,
    -- NULL when the run was not for exactly one tenant (audiences of all tenants, a range
    -- over several tenants). No foreign key: errors outlive a deleted tenant.
    tenant_id     text,
    job_name      text NOT NULL,
    -- Assets the run planned but did not materialize (empty for op-only jobs).
    asset_keys    text[] NOT NULL DEFAULT '{}',
    -- `dagster/partition`, or `first..last` for a run over a partition range.
    partition_key text,
    error_type    text NOT NULL,
    message       text NOT NULL CHECK (char_length(message) <= 1000),
    step_key      text,
    occurred_at   timestamptz NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now()
);
-- "Latest errors of a tenant" and "latest errors overall".
CREATE INDEX sync_errors_tenant_latest_idx ON cdp.sync_errors (tenant_id, occurred_at DESC);
CREATE INDEX sync_errors_latest_idx ON cdp.sync_errors (occurred_at DESC);
