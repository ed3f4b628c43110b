-- One row per catalog SKU (SKU context document). Ids stay text, like the order items.
with skus as (
    select * from {{ source('raw_vtex', 'skus') }}
)

select
    tenant_id,
    sku_id,
    payload ->> 'ProductId' as product_id,
    payload ->> 'SkuName' as sku_name,
    (payload ->> 'IsActive')::boolean as is_active
from skus
