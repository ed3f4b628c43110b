-- The landing time of each raw document, indexed per tenant: a staging refresh reads only
-- the documents landed since shortly before its newest staged one (dbt macro
-- landed_since_staged) instead of every document of the tenant. A million orders: the
-- refresh that found nothing new still read them all, and matched them against the staged
-- rows, to prove it.
CREATE INDEX orders_tenant_synced_idx ON raw_vtex.orders (tenant_id, synced_at);
CREATE INDEX customers_tenant_synced_idx ON raw_vtex.customers (tenant_id, synced_at);
