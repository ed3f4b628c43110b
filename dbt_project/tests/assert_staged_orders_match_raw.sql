{{ config(meta={"dagster": {"ref": {"name": "stg_vtex__orders"}}}) }}
-- Staging renames and casts: it must neither drop nor duplicate an order. Returns each
-- tenant in scope whose staged orders do not number its landed raw orders.
with raw_orders as (
    select
        tenant_id,
        count(*) as orders
    from {{ source('raw_vtex', 'orders') }}
    where {{ tenant_filter() }}
    group by tenant_id
),

staged_orders as (
    select
        tenant_id,
        count(*) as orders
    from {{ ref('stg_vtex__orders') }}
    where {{ tenant_filter() }}
    group by tenant_id
)

select
    raw_orders.tenant_id,
    raw_orders.orders as raw_orders,
    coalesce(staged_orders.orders, 0) as staged_orders
from raw_orders
left join staged_orders on raw_orders.tenant_id = staged_orders.tenant_id
where raw_orders.orders <> coalesce(staged_orders.orders, 0)
