-- Every order with the customer it belongs to. Orders of all statuses are kept with their
-- is_purchase flag; downstream models count purchases only.
-- Inner join: an order that landed after its tenant's identity keys were last built has no
-- customer yet and appears with the tenant's next run.
--
-- Incremental: a day's orders touch about 1 % of a tenant's orders, and rewriting all of
-- them was the largest write of a daily refresh. A run rebuilds
-- - the orders that are new or landed again (landed_at differs from the row's), looked for
--   among the orders of the identity records rebuilt since the tenant's purchases were last
--   built (built_at): an order landing changes its record's source_landing, so the record
--   is rebuilt (int_identity__records). A record holds all of a buyer's orders: comparing
--   them keeps the write to the orders that changed;
-- - every order of the records resolved again since (int_identity__customer_keys): a merge
--   or split of customers moves them to another customer_key.
-- Keyed like the table, delete+insert replaces exactly those orders.
-- replaced_customer_key is the customer a rebuilt order belonged to until then, when another
-- (a merge, a split, an order that changed hands): that customer's figures change too, and
-- the per-customer models downstream find it here (macro changed_customers_scope).
-- Indexed by key (what delete+insert finds the replaced rows by, and the grain) and by each
-- tenant's latest build. Created before an incremental run too: a table built before they
-- existed (an upgrade) was searched by nested loops over every row.
{{ config(
    pre_hook=[
        "{{ key_index(['tenant_id', 'order_id'], unique=true) if is_incremental() }}",
        "{{ key_index(['tenant_id', 'built_at']) if is_incremental() }}",
    ],
    post_hook=[
        "{{ key_index(['tenant_id', 'order_id'], unique=true) }}",
        "{{ key_index(['tenant_id', 'built_at']) }}",
    ],
) }}
-- depends_on: {{ ref('int_identity__records') }}
-- depends_on: {{ ref('stg_cdp__tenants') }}
{% if is_incremental() %}
{#- Columns added by an upgrade are NULL until the first run after it stores them. -#}
{%- set built_rows -%}
    (select tenant_id, order_id, customer_key,
        {{ built_columns(['landed_at', 'built_at'], 'timestamptz') }}
    from {{ this }})
{%- endset %}
{% endif %}
with orders as not materialized (
    select * from {{ ref('stg_vtex__orders') }}
    where {{ tenant_filter() }}
),

customer_keys as not materialized (
    select * from {{ ref('int_identity__customer_keys') }}
    where {{ tenant_filter() }}
),

{% if is_incremental() %}
-- The latest build of each tenant's purchases, read from the index on (tenant_id, built_at).
-- A tenant without purchases yet has every order built.
built_purchases as (
    select
        tenants.tenant_id,
        (
            select max(built.built_at) from {{ built_rows }} as built
            where built.tenant_id = tenants.tenant_id
        ) as built_at
    from {{ ref('stg_cdp__tenants') }} as tenants
    where {{ tenant_filter('tenants.tenant_id') }}
),

-- Records built since (their orders are compared with their rows) or resolved since (their
-- orders are all rebuilt). Materialized: a few thousand rows, whose orders the planner then
-- reads by the staged orders' record index, rather than joining every order first.
records_to_build as materialized (
    select tenant_id, record_id, bool_or(is_resolved) as is_resolved
    from (
        select records.tenant_id, records.record_id, false as is_resolved
        from {{ ref('int_identity__records') }} as records
        inner join built_purchases on records.tenant_id = built_purchases.tenant_id
        where built_purchases.built_at is null or records.built_at > built_purchases.built_at
        union all
        select customer_keys.tenant_id, customer_keys.record_id, true
        from customer_keys
        inner join built_purchases on customer_keys.tenant_id = built_purchases.tenant_id
        where built_purchases.built_at is null or customer_keys.built_at > built_purchases.built_at
    ) as changed_records
    group by tenant_id, record_id
),
{% endif %}

purchases as (
    select
        orders.tenant_id,
        orders.order_id,
        customer_keys.customer_key,
        orders.order_date,
        orders.order_total,
        orders.is_purchase,
        orders.created_at,
        -- The landing it was built from: an order landing again differs.
        orders.landed_at,
        {% if is_incremental() -%}
        nullif(built.customer_key, customer_keys.customer_key)
        {%- else -%}
            null::text
        {%- endif %} as replaced_customer_key
    from orders
    inner join customer_keys
        on orders.tenant_id = customer_keys.tenant_id
        and {{ order_record_id('orders.user_profile_id', 'orders.order_id') }} = customer_keys.record_id
    {% if is_incremental() %}
    inner join records_to_build
        on customer_keys.tenant_id = records_to_build.tenant_id
        and customer_keys.record_id = records_to_build.record_id
    left join {{ built_rows }} as built
        on orders.tenant_id = built.tenant_id
        and orders.order_id = built.order_id
    where records_to_build.is_resolved or built.landed_at is distinct from orders.landed_at
    {% endif %}
)

select
    *,
    -- When this run built the row: the next run rebuilds the orders of records built since.
    now() as built_at
from purchases
