-- Tenants, for their default country (phone calling code, audience country).
with tenants as (
    select * from {{ source('cdp', 'tenants') }}
)

select
    tenant_id,
    upper(default_country)::char(2) as default_country,
    active as is_active
from tenants
