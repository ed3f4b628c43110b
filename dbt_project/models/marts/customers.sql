-- One row per tenant and customer with at least one purchase on or before as_of (people
-- who only registered, or whose orders were all canceled, are not customers here), with
-- purchase figures and the best contact data of all the customer's identity records.
with purchase_summary as (
    select * from {{ ref('int_customers__purchase_summary') }}
    where {{ tenant_filter() }}
),

customer_keys as (
    select * from {{ ref('int_identity__customer_keys') }}
    where {{ tenant_filter() }}
),

identity_records as (
    select * from {{ ref('int_identity__records') }}
    where {{ tenant_filter() }}
),

tenants as (
    select * from {{ ref('stg_cdp__tenants') }}
),

-- Contact data: CL documents first (the customer's own profile, with the real e-mail),
-- then order profiles; within each, the most recently seen record first. Each attribute
-- takes the first record that has it.
profiles as (
    {%- set priority -%}
        case identity_records.record_source when 'master_data' then 0 else 1 end,
        identity_records.last_seen_at desc nulls last,
        identity_records.record_id
    {%- endset %}
    select
        customer_keys.tenant_id,
        customer_keys.customer_key,
        {{ first_non_null('identity_records.email_normalized', priority) }} as email,
        {{ first_non_null('identity_records.phone_e164', priority) }} as phone_e164,
        {{ first_non_null('identity_records.first_name', priority) }} as first_name,
        {{ first_non_null('identity_records.last_name', priority) }} as last_name,
        {{ first_non_null('identity_records.document_normalized', priority) }} as document,
        {{ first_non_null('identity_records.user_profile_id', priority) }} as user_profile_id,
        -- The latest CL document's choice; NULL (unknown) for customers without one.
        {{ first_non_null('identity_records.is_newsletter_opt_in', priority) }} as is_newsletter_opt_in
    from customer_keys
    inner join identity_records
        on customer_keys.tenant_id = identity_records.tenant_id
        and customer_keys.record_id = identity_records.record_id
    group by customer_keys.tenant_id, customer_keys.customer_key
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
    -- Hashed once here for every audience that carries the customer (macro
    -- audience_identity_columns): hashing in each audience view cost its refresh more than
    -- the rest of its query.
    {{ sha256_hex('profiles.email') }} as email_sha256,
    {{ sha256_hex('profiles.phone_e164') }} as phone_sha256,
    {{ sha256_hex(normalize_name('profiles.first_name')) }} as first_name_sha256,
    {{ sha256_hex(normalize_name('profiles.last_name')) }} as last_name_sha256,
    tenants.default_country as country,
    profiles.document,
    profiles.user_profile_id,
    profiles.is_newsletter_opt_in
from purchase_summary
left join profiles
    on purchase_summary.tenant_id = profiles.tenant_id
    and purchase_summary.customer_key = profiles.customer_key
left join tenants
    on purchase_summary.tenant_id = tenants.tenant_id
