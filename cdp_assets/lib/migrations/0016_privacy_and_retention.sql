-- Privacy requests (cdp_assets/privacy/): erasures, suppressions and their undoing, each step
-- with its completion time, kept as the proof a request was honoured. No clear identifier is
-- stored: what names the person is the SHA-256 of their normalized identifiers.

CREATE TABLE cdp.privacy_requests (
    request_id    bigserial PRIMARY KEY,
    -- No foreign key: the proof outlives a deleted tenant.
    tenant_id     text NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('erase', 'suppress', 'unsuppress')),
    -- The kind of identifier the operator gave (never its value).
    given         text NOT NULL CHECK (given IN ('email', 'phone', 'document', 'customer_key')),
    -- What an erase found and works through, so an interrupted request resumes without the
    -- clear values it masked: {"customer_keys": [...], "record_ids": [...],
    -- "order_ids": [...], "customer_ids": [...]} (none of them personal data).
    targets       jsonb NOT NULL DEFAULT '{}'::jsonb,
    status        text NOT NULL CHECK (status IN ('running', 'completed')),
    last_error    text,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    completed_at  timestamptz
);
CREATE INDEX privacy_requests_open_idx ON cdp.privacy_requests (requested_at)
    WHERE status = 'running';

CREATE TABLE cdp.privacy_request_steps (
    request_id   bigint NOT NULL REFERENCES cdp.privacy_requests ON DELETE CASCADE,
    step         text NOT NULL,
    position     integer NOT NULL,
    -- Counts of what the step touched.
    detail       jsonb NOT NULL DEFAULT '{}'::jsonb,
    started_at   timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz,
    PRIMARY KEY (request_id, step)
);

-- People no sync, import or feed event may bring back into an audience or a destination of
-- the tenant: SHA-256 of the normalized e-mail, E.164 phone or document digits.
CREATE TABLE cdp.privacy_suppressions (
    tenant_id         text NOT NULL,
    identifier_kind   text NOT NULL CHECK (identifier_kind IN ('email', 'phone', 'document')),
    identifier_sha256 text NOT NULL CHECK (identifier_sha256 ~ '^[0-9a-f]{64}$'),
    request_id        bigint NOT NULL REFERENCES cdp.privacy_requests,
    suppressed_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, identifier_sha256)
);

-- Whose data a destination may receive: 'none' (everyone in the audience),
-- 'newsletter_opt_in' (a Master Data newsletter opt-in) or 'not_opted_out' (no opt-out).
ALTER TABLE cdp.destinations
    ADD COLUMN consent_policy text NOT NULL DEFAULT 'none'
        CHECK (consent_policy IN ('none', 'newsletter_opt_in', 'not_opted_out'));

-- Retention of the recorded history (cdp_assets/ops/maintenance.py) reads these by age.
CREATE INDEX activation_runs_finished_idx ON cdp.activation_runs (finished_at);
CREATE INDEX rejects_last_seen_idx ON raw_vtex.rejects (last_seen_at);
