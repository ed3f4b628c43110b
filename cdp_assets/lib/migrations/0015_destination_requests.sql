-- What a platform acknowledged but has yet to process: a Data Manager ingest request (read
-- back with RetrieveRequestStatus), a Google Ads job still running. Members sent under such a
-- request are in cdp.destination_members with its id (so they are not sent twice) but are not
-- confirmed until the platform's verdict; members whose removal is pending have left the state
-- and are kept here, to be restored if the removal fails (the platform still holds them).
CREATE TABLE cdp.destination_requests (
    request_id          bigserial PRIMARY KEY,
    destination_id      text NOT NULL,
    audience            text NOT NULL,
    activation_run_id   bigint REFERENCES cdp.activation_runs ON DELETE SET NULL,
    -- The platform's id: a Data Manager request id, a Google Ads job resource name.
    platform_request_id text NOT NULL,
    operation           text NOT NULL CHECK (operation IN ('add', 'remove')),
    -- Removals: the rows removed, as [member_key, fingerprint, source_fingerprint, identifiers].
    members             jsonb NOT NULL DEFAULT '[]'::jsonb,
    status              text NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'confirmed', 'failed')),
    reason              text,
    sent_at             timestamptz NOT NULL DEFAULT now(),
    settled_at          timestamptz,
    FOREIGN KEY (destination_id, audience)
        REFERENCES cdp.destination_audiences ON DELETE CASCADE
);
CREATE INDEX destination_requests_pending_idx
    ON cdp.destination_requests (destination_id, audience) WHERE status = 'pending';

-- The pending request a member was sent under; NULL once the platform confirmed it.
ALTER TABLE cdp.destination_members ADD COLUMN pending_request bigint;
CREATE INDEX destination_members_pending_idx
    ON cdp.destination_members (pending_request) WHERE pending_request IS NOT NULL;

-- Members of the audience awaiting the platform's verdict when the sync ended.
ALTER TABLE cdp.activation_runs ADD COLUMN pending integer NOT NULL DEFAULT 0;
