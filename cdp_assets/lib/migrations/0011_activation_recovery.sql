-- A destination audience deleted on its platform (in Meta Ads Manager, a Customer Match list
-- removed in Google Ads) is created again and every member sent to it, in the sync that finds
-- it gone. Off, that sync fails naming the cause, and goes on failing until
-- `cdp destinations reset` forgets the deleted audience.
ALTER TABLE cdp.destinations
    ADD COLUMN recreate_deleted_audiences boolean NOT NULL DEFAULT true;

-- 'abandoned': a sync whose Dagster run ended (its process killed, the run failed or was
-- canceled) before the sync finished; the next activation run closes such rows.
ALTER TABLE cdp.activation_runs
    DROP CONSTRAINT activation_runs_status_check,
    ADD CONSTRAINT activation_runs_status_check
        CHECK (status IN ('running', 'synced', 'dry_run', 'skipped', 'refused', 'failed',
                          'abandoned'));
-- Every activation run looks for the open rows: a handful among the whole history.
CREATE INDEX activation_runs_running_idx ON cdp.activation_runs (started_at)
    WHERE status = 'running';
