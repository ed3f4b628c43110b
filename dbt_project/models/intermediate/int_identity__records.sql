-- One row per identity record with its normalized identity keys. A record is either
-- - an order profile: the orders of one buyer (same userProfileId), or a single order
--   without a userProfileId (a guest checkout VTEX did not profile), or
-- - a Master Data CL document (the customer's own profile, with the real e-mail).
-- int_identity__customer_keys links records that share a key into one customer.
--
-- Incremental: a run rebuilds only the records whose source rows landed since they were
-- built. source_landing is the sum of those rows' landing times: a new order, or an order or
-- CL document landing again, changes it. A record whose tenant's default country changed is
-- rebuilt too (its phones normalize differently). The post-hook deletes the order profiles
-- left without orders (an order that gained or lost its userProfileId moved to another
-- record). A change to the normalization itself takes a --full-refresh.
{{ config(post_hook=[
    "{{ delete_order_records_gone() }}",
    "{{ key_index(['tenant_id', 'record_id'], unique=true) }}",
]) }}
{% set latest_first = 'last_seen_at desc, order_id desc' %}

-- Not materialized: an incremental run reads them twice (which records to rebuild, then those
-- records), and a second scan of the staging table costs less than a copy of it.
with orders as not materialized (
    select
        *,
        {{ order_record_id('user_profile_id', 'order_id') }} as record_id
    from {{ ref('stg_vtex__orders') }}
    where {{ tenant_filter() }}
),

master_data as not materialized (
    select
        *,
        'cl:' || customer_id as record_id
    from {{ ref('stg_vtex__customers') }}
    where {{ tenant_filter() }}
),

tenants as (
    select
        tenant_id,
        default_country,
        {{ country_calling_code('default_country') }} as calling_code
    from {{ ref('stg_cdp__tenants') }}
),

{% if is_incremental() %}
built_records as (
    select tenant_id, record_id, country, {{ built_columns(['source_landing'], 'numeric') }}
    from {{ this }}
    where {{ tenant_filter() }}
),

source_landings as (
    select tenant_id, record_id, sum(extract(epoch from landed_at)) as source_landing
    from orders
    group by tenant_id, record_id
    union all
    select tenant_id, record_id, extract(epoch from landed_at)
    from master_data
),

records_to_build as (
    select source_landings.tenant_id, source_landings.record_id
    from source_landings
    left join tenants on source_landings.tenant_id = tenants.tenant_id
    left join built_records
        on source_landings.tenant_id = built_records.tenant_id
        and source_landings.record_id = built_records.record_id
    where built_records.source_landing is distinct from source_landings.source_landing
        or built_records.country is distinct from tenants.default_country
),
{% endif %}

-- Record ids carry their kind as a prefix. 'cl:' sorts before 'order:' and 'profile:', so
-- a customer with a CL document keeps the key derived from it as new orders arrive.
-- A buyer's orders mostly repeat the same contact data: each distinct contact (per record)
-- is normalized once, with the time of its latest order, instead of once per order (the
-- regular expressions were most of this model's time on a million orders).
order_contacts as (
    select
        tenant_id,
        record_id,
        user_profile_id,
        order_email_raw as email_raw,
        document,
        document_type,
        phone_raw,
        first_name,
        last_name,
        max(order_id) as order_id,
        min(created_at) as first_seen_at,
        max(created_at) as last_seen_at,
        sum(extract(epoch from landed_at)) as source_landing
    from orders
    {% if is_incremental() %}
    where (tenant_id, record_id) in (select tenant_id, record_id from records_to_build)
    {% endif %}
    group by
        tenant_id, record_id, user_profile_id, order_email_raw, document, document_type,
        phone_raw, first_name, last_name
),

order_identities as (
    select
        order_contacts.tenant_id,
        order_contacts.record_id,
        order_contacts.order_id,
        order_contacts.first_seen_at,
        order_contacts.last_seen_at,
        order_contacts.source_landing,
        order_contacts.user_profile_id,
        {{ normalized_contact_columns('order_contacts') }}
    from order_contacts
    left join tenants on order_contacts.tenant_id = tenants.tenant_id
),

-- A buyer's orders can disagree (a new phone, a document added later): each key takes the
-- latest order that has one (of two contacts whose latest orders share an instant, the one
-- with the larger order id).
order_profiles as (
    select
        tenant_id,
        record_id,
        'order_profile' as record_source,
        coalesce(max(user_profile_id), max(order_id)) as source_id,
        max(user_profile_id) as user_profile_id,
        {{ first_non_null('email_raw', latest_first) }} as email_raw,
        {{ first_non_null('email_normalized', latest_first) }} as email_normalized,
        {{ first_non_null('document_normalized', latest_first) }} as document_normalized,
        (
            array_agg(document_type order by {{ latest_first }})
            filter (where document_normalized is not null)
        )[1] as document_type,
        {{ first_non_null('phone_raw', latest_first) }} as phone_raw,
        {{ first_non_null('phone_e164', latest_first) }} as phone_e164,
        {{ first_non_null('first_name', latest_first) }} as first_name,
        {{ first_non_null('last_name', latest_first) }} as last_name,
        -- Newsletter consent is the customer's CL choice, not an order attribute.
        null::boolean as is_newsletter_opt_in,
        min(first_seen_at) as first_seen_at,
        max(last_seen_at) as last_seen_at,
        sum(source_landing) as source_landing
    from order_identities
    group by tenant_id, record_id
),

master_data_records as (
    select
        master_data.tenant_id,
        master_data.record_id,
        'master_data' as record_source,
        master_data.customer_id as source_id,
        -- CL userId is the userProfileId on the customer's orders.
        master_data.user_id as user_profile_id,
        {{ normalized_contact_columns('master_data') }},
        master_data.is_newsletter_opt_in,
        master_data.created_at as first_seen_at,
        coalesce(master_data.updated_at, master_data.created_at) as last_seen_at,
        extract(epoch from master_data.landed_at) as source_landing
    from master_data
    left join tenants on master_data.tenant_id = tenants.tenant_id
    {% if is_incremental() %}
    where (master_data.tenant_id, master_data.record_id)
        in (select tenant_id, record_id from records_to_build)
    {% endif %}
),

records as (
    select * from order_profiles
    union all
    select * from master_data_records
)

select
    records.tenant_id,
    records.record_id,
    records.record_source,
    records.source_id,
    records.user_profile_id,
    records.email_raw,
    records.email_normalized,
    records.document_normalized,
    -- The type qualifies the document key (a CPF and a CNPJ may share digits).
    case when records.document_normalized is not null then coalesce(records.document_type, 'unknown') end
        as document_type,
    records.phone_raw,
    records.phone_e164,
    records.first_name,
    records.last_name,
    records.is_newsletter_opt_in,
    tenants.default_country as country,
    records.first_seen_at,
    records.last_seen_at,
    records.source_landing,
    -- When this run rebuilt the record: int_customers__profiles rebuilds its customer's profile.
    now() as built_at
from records
left join tenants on records.tenant_id = tenants.tenant_id
