-- A customer_key belongs to exactly one tenant (the tenant is hashed into it), so that
-- joins on customer_key alone (relationships tests, activation) can never cross tenants.
-- Returns the keys found in several tenants.
select
    customer_key,
    count(distinct tenant_id) as tenants
from {{ ref('int_identity__customer_keys') }}
group by customer_key
having count(distinct tenant_id) > 1
