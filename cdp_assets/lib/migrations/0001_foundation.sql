-- Tenants, sync cursors, raw VTEX documents and quarantined records.
CREATE SCHEMA IF NOT EXISTS cdp;
CREATE SCHEMA IF NOT EXISTS raw_vtex;

CREATE TABLE cdp.tenants (
    tenant_id      text PRIMARY KEY CHECK (tenant_id ~ '^[a-z][a-z0-9_]{1,62}$'),
    account_name   text NOT NULL CHECK (account_name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    environment    text NOT NULL DEFAULT 'vtexcommercestable'
                   CHECK (environment IN ('vtexcommercestable', 'vtexcommercebeta')),
    -- Names of environment variables holding the credentials, never the secrets.
    app_key_ref    text NOT NULL CHECK (app_key_ref ~ '^[A-Z_][A-Z0-9_]{0,127}$'),
    app_token_ref  text NOT NULL CHECK (app_token_ref ~ '^[A-Z_][A-Z0-9_]{0,127}$'),
    active         boolean NOT NULL DEFAULT true,
    priority       integer NOT NULL DEFAULT 100,
    history_start  date NOT NULL DEFAULT DATE '2020-01-01',
    default_country text NOT NULL DEFAULT 'BR' CHECK (default_country ~ '^[A-Z]{2}$'),
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- One cursor per tenant, entity and scope (the month for orders, '' for whole-tenant entities).
CREATE TABLE cdp.sync_state (
    tenant_id      text NOT NULL REFERENCES cdp.tenants (tenant_id) ON DELETE CASCADE,
    entity         text NOT NULL,
    scope          text NOT NULL DEFAULT '',
    synced_through timestamptz NOT NULL,
    last_run_id    text,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, entity, scope)
);

CREATE TABLE raw_vtex.orders (
    tenant_id     text NOT NULL,
    order_id      text NOT NULL,
    change_stamp  timestamptz NOT NULL,
    creation_date timestamptz NOT NULL,
    payload       jsonb NOT NULL,
    synced_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, order_id)
);
CREATE INDEX orders_tenant_creation_idx ON raw_vtex.orders (tenant_id, creation_date);

CREATE TABLE raw_vtex.products (
    tenant_id    text NOT NULL,
    product_id   text NOT NULL,
    change_stamp timestamptz NOT NULL,
    payload      jsonb NOT NULL,
    synced_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, product_id)
);

CREATE TABLE raw_vtex.skus (
    tenant_id    text NOT NULL,
    sku_id       text NOT NULL,
    change_stamp timestamptz NOT NULL,
    payload      jsonb NOT NULL,
    synced_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, sku_id)
);

CREATE TABLE raw_vtex.customers (
    tenant_id    text NOT NULL,
    customer_id  text NOT NULL,
    change_stamp timestamptz NOT NULL,
    payload      jsonb NOT NULL,
    synced_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, customer_id)
);

-- One row per distinct bad record; seeing it again bumps the counters instead of piling up.
CREATE TABLE raw_vtex.rejects (
    tenant_id     text NOT NULL,
    entity        text NOT NULL,
    natural_key   text,
    reason        text NOT NULL,
    raw_text      text NOT NULL,
    raw_md5       text NOT NULL,
    run_id        text,
    first_seen_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    times_seen    integer NOT NULL DEFAULT 1,
    PRIMARY KEY (tenant_id, entity, raw_md5)
);
