-- The purchase summary as of var as_of (macros/purchase_summary.sql).
--
-- Incremental: a refresh rebuilds the customers whose purchases changed since the tenant's
-- rows were built, or the whole tenant on the first refresh of a day (macro
-- changed_customers_scope). Its grain as a unique index (what the refresh's delete finds the
-- rebuilt rows by) and each tenant's latest build indexed (where the next one starts).
{{ config(post_hook=[
    "{{ key_index(['tenant_id', 'customer_key'], unique=true) }}",
    "{{ key_index(['tenant_id', 'built_at']) }}",
]) }}
-- depends_on: {{ ref('stg_cdp__tenants') }}
{{ purchase_summary(as_of_date(), changed_only=true) }}
