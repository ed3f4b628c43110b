-- Orders VTEX listed whose Get order kept failing after the client's retries. The next run of
-- their month reads them again; a row is deleted once its order lands (or is quarantined in
-- raw_vtex.rejects).
CREATE TABLE raw_vtex.unreadable_orders (
    tenant_id     text NOT NULL,
    order_id      text NOT NULL,
    month         date NOT NULL,  -- the order month whose runs read it again
    status        text,           -- the order's status as List orders last reported it
    error         text NOT NULL,  -- the last failure: endpoint and what it answered
    attempts      integer NOT NULL DEFAULT 1,  -- runs that failed to read it
    first_seen_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    run_id        text,
    PRIMARY KEY (tenant_id, order_id)
);
CREATE INDEX unreadable_orders_month_idx ON raw_vtex.unreadable_orders (tenant_id, month);

-- Each order month of each tenant as its last sync (or import) left it:
--   reconciled    what landed, was quarantined or is unread accounts for VTEX's paging.total
--   unreconciled  VTEX reported more orders than its pages held: the month is read again
--   failed        the month's run failed before it was read
--   unavailable   older than the two years VTEX serves orders for
--   imported      unavailable from VTEX, and orders of it were imported from files
CREATE TABLE cdp.order_months (
    tenant_id      text NOT NULL REFERENCES cdp.tenants (tenant_id) ON DELETE CASCADE,
    month          date NOT NULL,
    state          text NOT NULL
        CHECK (state IN ('reconciled', 'unreconciled', 'failed', 'unavailable', 'imported')),
    vtex_reported  integer,      -- paging.total over the month's list windows
    accounted      integer,      -- landed + quarantined + unread
    available_from timestamptz,  -- where VTEX's two years begin, in the month that holds it
    detail         text,
    run_id         text,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, month)
);

-- A tenant's history starts where VTEX's serves orders from; older orders are imported.
ALTER TABLE cdp.tenants
    ALTER COLUMN history_start SET DEFAULT (current_date - interval '2 years' + interval '2 days')::date;
