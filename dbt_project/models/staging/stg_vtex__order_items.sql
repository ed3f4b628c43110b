-- One row per order line (items[] of the Get-order document), prices from cents to units.
-- Its grain as a unique index: the incremental key is the order (its lines are replaced
-- together), and the uniqueness test over three million lines reads this index alone.
{{ config(post_hook="{{ key_index(['tenant_id', 'order_id', 'item_index'], unique=true) }}") }}
with orders as (
    select *
    from {{ landed_since_staged(source('raw_vtex', 'orders'), 'order_id') }} as raw_orders
    where {{ tenant_filter('raw_orders.tenant_id') }}
),

items as (
    select
        orders.tenant_id,
        orders.order_id,
        orders.synced_at,
        -- 0-based, like VTEX's itemIndex in shippingData.logisticsInfo.
        (item.ordinality - 1)::integer as item_index,
        item.value as item
    from orders
    -- The landed summary's items, or the document's where there is no summary (see
    -- stg_vtex__orders).
    cross join lateral jsonb_to_record(coalesce(orders.summary, orders.payload)) as document (items jsonb)
    cross join lateral jsonb_array_elements(
        case when jsonb_typeof(document.items) = 'array' then document.items else '[]'::jsonb end
    ) with ordinality as item (value, ordinality)
)

select
    tenant_id,
    order_id,
    item_index,
    item ->> 'id' as sku_id,
    item ->> 'productId' as product_id,
    (item ->> 'quantity')::integer as quantity,
    ((item ->> 'price')::numeric / 100)::numeric(18, 2) as unit_price,
    ((item ->> 'sellingPrice')::numeric / 100)::numeric(18, 2) as selling_price,
    ((item ->> 'sellingPrice')::numeric * (item ->> 'quantity')::numeric / 100)::numeric(18, 2) as line_total,
    synced_at as landed_at
from items
