-- One row per catalog product. Ids stay text, like the landed keys and the order items.
with products as (
    select * from {{ source('raw_vtex', 'products') }}
)

select
    tenant_id,
    product_id,
    payload ->> 'Name' as product_name,
    payload ->> 'CategoryId' as category_id,
    payload ->> 'BrandId' as brand_id,
    -- A flag that is not a JSON boolean becomes NULL instead of failing the whole view.
    case when jsonb_typeof(payload -> 'IsActive') = 'boolean'
            then (payload ->> 'IsActive')::boolean
    end as is_active
from products
