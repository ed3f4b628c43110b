-- Activation: where each tenant's audiences go, what each destination last confirmed, and
-- the history of every sync. Credentials are environment variable names, never secrets.

CREATE TABLE cdp.destinations (
    destination_id     text PRIMARY KEY CHECK (destination_id ~ '^[a-z][a-z0-9_]{1,62}$'),
    tenant_id          text NOT NULL REFERENCES cdp.tenants (tenant_id) ON DELETE CASCADE,
    platform           text NOT NULL
                       CHECK (platform IN ('meta', 'google_data_manager', 'google_ads',
                                           'vtex_collections')),
    -- Meta ad account digits, Google Ads customer id (10 digits); '' for VTEX (the tenant's).
    account_id         text NOT NULL DEFAULT '',
    -- Google manager account the credentials belong to, when it is not account_id itself.
    login_account_id   text,
    -- {"access_token": "META_ACME_TOKEN"}: role -> environment variable name.
    credential_refs    jsonb NOT NULL DEFAULT '{}'::jsonb
                       CHECK (jsonb_typeof(credential_refs) = 'object'),
    -- Google consent for every member sent (job/request level), per EEA rules.
    ad_user_data_consent      text NOT NULL DEFAULT 'UNSPECIFIED'
                              CHECK (ad_user_data_consent IN ('GRANTED', 'DENIED', 'UNSPECIFIED')),
    ad_personalization_consent text NOT NULL DEFAULT 'UNSPECIFIED'
                              CHECK (ad_personalization_consent IN ('GRANTED', 'DENIED',
                                                                    'UNSPECIFIED')),
    min_audience_size  integer NOT NULL DEFAULT 100 CHECK (min_audience_size >= 0),
    -- A run that would remove more than this share of the confirmed members is refused
    -- unless forced.
    max_removal_share  numeric NOT NULL DEFAULT 0.5 CHECK (max_removal_share BETWEEN 0 AND 1),
    dry_run            boolean NOT NULL DEFAULT false,
    active             boolean NOT NULL DEFAULT true,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX destinations_tenant_idx ON cdp.destinations (tenant_id);

-- What goes to a destination: an audience materialized view (audiences.<audience>) for ad
-- platforms, a collection rule (cdp_assets/vtex/collection_rules.py) for VTEX.
CREATE TABLE cdp.destination_audiences (
    destination_id        text NOT NULL REFERENCES cdp.destinations ON DELETE CASCADE,
    audience              text NOT NULL CHECK (audience ~ '^[a-z][a-z0-9_]{1,62}$'),
    -- Rule parameters (collections: top_n, days).
    params                jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- The platform's id once created: Meta audience id, Google user list resource name,
    -- VTEX "collection_id/subcollection_id".
    platform_audience_id  text,
    -- Membership signature (count and digest of member keys) at the last completed sync,
    -- so a sensor can tell which audiences changed since.
    synced_signature      text,
    active                boolean NOT NULL DEFAULT true,
    created_at            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (destination_id, audience)
);

-- Members the platform confirmed, hashed as sent (identifiers in the destination's row
-- order; removals are sent from here, so a customer deleted upstream can still be removed).
-- source_fingerprint digests the unhashed inputs: while they are unchanged the stored
-- identifiers are reused instead of normalizing and hashing the member again.
CREATE TABLE cdp.destination_members (
    destination_id     text NOT NULL,
    audience           text NOT NULL,
    member_key         text NOT NULL,
    fingerprint        text NOT NULL,
    source_fingerprint text NOT NULL,
    identifiers        text[] NOT NULL,
    confirmed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (destination_id, audience, member_key),
    FOREIGN KEY (destination_id, audience)
        REFERENCES cdp.destination_audiences ON DELETE CASCADE
);

-- Sync history: one row per destination audience per run (dry runs and skips included).
CREATE TABLE cdp.activation_runs (
    activation_run_id bigserial PRIMARY KEY,
    destination_id    text NOT NULL,
    audience          text NOT NULL,
    tenant_id         text NOT NULL,
    platform          text NOT NULL,
    dagster_run_id    text,
    mode              text NOT NULL CHECK (mode IN ('diff', 'replace')),
    dry_run           boolean NOT NULL,
    status            text NOT NULL
                      CHECK (status IN ('running', 'synced', 'dry_run', 'skipped', 'refused',
                                        'failed')),
    reason            text,
    desired           integer NOT NULL DEFAULT 0,
    unmatchable       integer NOT NULL DEFAULT 0,
    added             integer NOT NULL DEFAULT 0,
    removed           integer NOT NULL DEFAULT 0,
    unchanged         integer NOT NULL DEFAULT 0,
    rejected          integer NOT NULL DEFAULT 0,
    requests          integer NOT NULL DEFAULT 0,
    match_info        jsonb NOT NULL DEFAULT '{}'::jsonb,
    started_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz
);
CREATE INDEX activation_runs_destination_idx
    ON cdp.activation_runs (destination_id, audience, started_at DESC);

-- Members a platform refused, with its reason; they stay out of destination_members, so the
-- next run sends them again.
CREATE TABLE cdp.activation_rejects (
    activation_run_id bigint NOT NULL REFERENCES cdp.activation_runs ON DELETE CASCADE,
    member_key        text NOT NULL,
    operation         text NOT NULL CHECK (operation IN ('add', 'remove')),
    reason            text NOT NULL,
    rejected_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX activation_rejects_run_idx ON cdp.activation_rejects (activation_run_id);
