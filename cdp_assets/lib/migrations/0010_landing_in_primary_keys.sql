-- The landing time in the primary key's index of the raw tables staging parses incrementally.
-- Staging finds the documents that landed since it last parsed them with an anti-join on
-- (tenant, key, landing time) against its own table (dbt macro landed_since_staged). With
-- synced_at in this index, and (key, landed_at) indexed on the staging side, that join reads
-- the two indexes in order instead of the raw table, documents and all (a million orders:
-- 2.4 s -> 0.7 s). INCLUDE leaves uniqueness, and ON CONFLICT's inference, on the key alone.
ALTER TABLE raw_vtex.orders
    DROP CONSTRAINT orders_pkey,
    ADD CONSTRAINT orders_pkey PRIMARY KEY (tenant_id, order_id) INCLUDE (synced_at);
ALTER TABLE raw_vtex.customers
    DROP CONSTRAINT customers_pkey,
    ADD CONSTRAINT customers_pkey PRIMARY KEY (tenant_id, customer_id) INCLUDE (synced_at);
