-- A destination audience whose syncs keep failing (revoked credentials, an account the
-- platform closed) rests between the audience-change sensor's attempts, longer after each
-- failure in a row (cdp_assets/activation/destinations.py: resting_until). Without it, every
-- refresh that changed its members launched another push that failed and alerted.
--
-- failures_in_a_row: failed syncs since the last completed one (or the last
-- `cdp destinations reset`); last_failed_at: when the latest of them ended.
ALTER TABLE cdp.destination_audiences
    ADD COLUMN failures_in_a_row integer NOT NULL DEFAULT 0,
    ADD COLUMN last_failed_at timestamptz;
