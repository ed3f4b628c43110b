-- Each VTEX account's request budget, shared by every process and host that calls it: a token
-- bucket (tokens refill at the callers' rate from `updated_at`, up to one second's worth) that
-- processes draw from in batches, and a pause every caller honours after VTEX answered 429.
-- Tokens go below zero when callers take more than the bucket holds: each waits out its share.
CREATE TABLE cdp.vtex_request_budget (
    account text PRIMARY KEY,
    tokens double precision NOT NULL,
    updated_at timestamptz NOT NULL,
    paused_until timestamptz
);
