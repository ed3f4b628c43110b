-- Every order with the customer it belongs to. Orders of all statuses are kept with their
-- is_purchase flag; downstream models count purchases only.
-- Inner join: an order that landed after its tenant's identity keys were last built has no
-- customer yet and appears with the tenant's next run.
with orders as (
    select * from {{ ref('stg_vtex__orders') }}
    where {{ tenant_filter() }}
),

customer_keys as (
    select * from {{ ref('int_identity__customer_keys') }}
)

select
    orders.tenant_id,
    orders.order_id,
    customer_keys.customer_key,
    orders.order_date,
    orders.order_total,
    orders.is_purchase,
    orders.created_at
from orders
inner join customer_keys
    on orders.tenant_id = customer_keys.tenant_id
    and {{ order_record_id('orders.user_profile_id', 'orders.order_id') }} = customer_keys.record_id
