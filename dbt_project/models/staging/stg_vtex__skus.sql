-- One row per catalog SKU (SKU context document). Ids stay text, like the order items.
with skus as (
    select * from {{ source('raw_vtex', 'skus') }}
)

select
    tenant_id,
    sku_id,
    payload ->> 'ProductId' as product_id,
    payload ->> 'SkuName' as sku_name,
    -- A flag that is not a JSON boolean becomes NULL instead of failing the whole view.
    case when jsonb_typeof(payload -> 'IsActive') = 'boolean'
            then (payload ->> 'IsActive')::boolean
    end as is_active
from skus
