-- One row per tenant and customer with at least one purchase on or before as_of (people
-- who only registered, or whose orders were all canceled, are not customers here), with
-- purchase figures and the best contact data of all the customer's identity records
-- (int_customers__profiles).
--
-- Incremental: a refresh rebuilds the customers whose purchase summary or profile it rebuilt
-- since the tenant's rows were built, or the whole tenant on the first refresh of a day
-- (macro changed_customers_scope, the pre-hook).
-- depends_on: {{ ref('int_orders__purchases') }}
-- depends_on: {{ ref('int_identity__customer_keys') }}
-- depends_on: {{ source('cdp', 'privacy_suppressions') }}
with purchase_summary as (
    select * from {{ ref('int_customers__purchase_summary') }} as purchase_summary
    where {{ tenant_filter() }} and {{ in_changed_customers('purchase_summary') }}
),

profiles as (
    select * from {{ ref('int_customers__profiles') }}
    where {{ tenant_filter() }}
),

tenants as (
    select * from {{ ref('stg_cdp__tenants') }}
)

select
    purchase_summary.tenant_id,
    purchase_summary.customer_key,
    purchase_summary.first_purchase_at,
    purchase_summary.last_purchase_at,
    purchase_summary.orders as purchases,
    purchase_summary.revenue,
    (purchase_summary.revenue / purchase_summary.orders)::numeric(18, 2) as avg_order_value,
    purchase_summary.age_t_days - purchase_summary.recency_t_x_days as days_since_last_purchase,
    profiles.email,
    profiles.phone_e164,
    profiles.first_name,
    profiles.last_name,
    -- Hashed once, in the profile, for every audience that carries the customer (macro
    -- audience_identity_columns).
    profiles.email_sha256,
    profiles.phone_sha256,
    profiles.first_name_sha256,
    profiles.last_name_sha256,
    tenants.default_country as country,
    profiles.document,
    profiles.user_profile_id,
    profiles.is_newsletter_opt_in,
    purchase_summary.as_of,
    now() as built_at
from purchase_summary
left join profiles
    on purchase_summary.tenant_id = profiles.tenant_id
    and purchase_summary.customer_key = profiles.customer_key
left join tenants
    on purchase_summary.tenant_id = tenants.tenant_id
