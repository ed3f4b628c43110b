-- VTEX orders feed v3 per tenant (`cdp tenants feed`): whether the feed sensor drains it,
-- the settings it was configured with on VTEX (to recreate it when VTEX deletes a feed that
-- saw no event for a whole retention period), and what the last drain found (idle feeds
-- are polled less often).
CREATE TABLE cdp.order_feeds (
    tenant_id                  text PRIMARY KEY REFERENCES cdp.tenants (tenant_id) ON DELETE CASCADE,
    enabled                    boolean NOT NULL,
    -- The FromWorkflow status filter; NULL delivers every status change.
    statuses                   text[],
    visibility_timeout_seconds integer NOT NULL CHECK (visibility_timeout_seconds >= 0),
    retention_seconds          integer NOT NULL
                               CHECK (retention_seconds BETWEEN 345600 AND 1209600),
    last_drained_at            timestamptz,
    last_events                integer,
    updated_at                 timestamptz NOT NULL DEFAULT now()
);
