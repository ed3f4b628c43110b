-- One row per resolved customer: the best contact data of all its identity records, with the
-- identifiers hashed once for every audience (customers carries them on).
--
-- Incremental: it does not depend on as_of, and a day's orders change few customers' records,
-- so a run rebuilds only the profiles of the customers with a record or key that a run rebuilt
-- since the tenant's latest profile was built (built_at), and the post-hook deletes the
-- profiles whose customer is gone. A customer that lost a record keeps a rebuilt profile:
-- identity resolution rewrites every record of a customer a change touches.
{{ config(post_hook=[
    "{{ delete_rows_gone(ref('int_identity__customer_keys'), 'customer_key') }}",
    "{{ key_index(['tenant_id', 'customer_key'], unique=true) }}",
]) }}
-- Not materialized: read three times each, and the planner must be free to read only the rows
-- of the customers to build.
with customer_keys as not materialized (
    select * from {{ ref('int_identity__customer_keys') }}
    where {{ tenant_filter() }}
),

identity_records as not materialized (
    select * from {{ ref('int_identity__records') }}
    where {{ tenant_filter() }}
),

{% if is_incremental() %}
built_profiles as (
    select tenant_id, max(built_at) as built_at
    from {{ this }}
    where {{ tenant_filter() }}
    group by tenant_id
),

-- A tenant without profiles yet has every customer rebuilt.
customers_to_build as (
    select customer_keys.tenant_id, customer_keys.customer_key
    from customer_keys
    left join built_profiles on customer_keys.tenant_id = built_profiles.tenant_id
    where built_profiles.built_at is null or customer_keys.built_at > built_profiles.built_at
    union
    select customer_keys.tenant_id, customer_keys.customer_key
    from identity_records
    inner join built_profiles on identity_records.tenant_id = built_profiles.tenant_id
    inner join customer_keys
        on identity_records.tenant_id = customer_keys.tenant_id
        and identity_records.record_id = customer_keys.record_id
    where identity_records.built_at > built_profiles.built_at
),
{% endif %}

-- CL documents first (the customer's own profile, with the real e-mail), then order
-- profiles; within each, the most recently seen record first. Each attribute takes the first
-- record that has it.
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
    {% if is_incremental() %}
    where (customer_keys.tenant_id, customer_keys.customer_key)
        in (select tenant_id, customer_key from customers_to_build)
    {% endif %}
    group by customer_keys.tenant_id, customer_keys.customer_key
)

select
    tenant_id,
    customer_key,
    email,
    phone_e164,
    first_name,
    last_name,
    -- Hashing in each audience view cost its refresh more than the rest of its query.
    {{ sha256_hex('email') }} as email_sha256,
    {{ sha256_hex('phone_e164') }} as phone_sha256,
    {{ sha256_hex(normalize_name('first_name')) }} as first_name_sha256,
    {{ sha256_hex(normalize_name('last_name')) }} as last_name_sha256,
    document,
    user_profile_id,
    is_newsletter_opt_in,
    now() as built_at
from profiles
