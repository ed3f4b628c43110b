-- A run over a block of tenants that fails for some of them (the 48-hour orders sync, the
-- feed's drains, a refresh of several tenants) is recorded once per tenant it failed for,
-- with that tenant's assets, so that each tenant's latest error is its own (`cdp status`).
-- A run for one tenant keeps its one row, and so does a run for none (its tenant NULL).
ALTER TABLE cdp.sync_errors DROP CONSTRAINT sync_errors_run_id_key;
CREATE UNIQUE INDEX sync_errors_run_tenant_key
    ON cdp.sync_errors (run_id, (coalesce(tenant_id, '')));
