-- One row per order: the Get-order document flattened, money from integer cents to units.
{{ config(post_hook=[
    "{{ order_record_index() }}",
    "{{ key_index(['tenant_id', 'order_id'], unique=true) }}",
]) }}
with orders as (
    select *
    from {{ landed_since_staged(source('raw_vtex', 'orders'), 'order_id') }} as raw_orders
    where {{ tenant_filter('raw_orders.tenant_id') }}
),

-- The landed summary, not the document: it holds the fields read here in the document's own
-- shape, a few hundred bytes stored inline, where the document is a large compressed value
-- that each read would decompress whole (migration 0009).
-- Orders landed before the summary existed have none: their document is read instead.
documents as (
    select
        orders.tenant_id,
        orders.order_id,
        orders.creation_date,
        orders.change_stamp,
        orders.synced_at,
        document.status,
        document.value,
        document."clientProfileData" as profile,
        document."storePreferencesData" as store_preferences,
        document.items
    from orders
    cross join lateral jsonb_to_record(coalesce(orders.summary, orders.payload)) as document (
        status text,
        value jsonb,
        "clientProfileData" jsonb,
        "storePreferencesData" jsonb,
        items jsonb
    )
),

renamed as (
    select
        tenant_id,
        order_id,
        status,
        -- creation_date / change_stamp are the landed copies of creationDate / lastChange,
        -- already timestamptz (VTEX's 7 fractional digits rounded to microseconds).
        creation_date as created_at,
        change_stamp as last_change_at,
        synced_at as landed_at,
        -- A value that is not a JSON number (the landing rejects those) becomes NULL
        -- instead of failing the whole model.
        case
            when jsonb_typeof(value) = 'number'
                then ((value #>> '{}')::numeric / 100)::numeric(18, 2)
        end as order_total,
        store_preferences ->> 'currencyCode' as currency_code,
        nullif(profile ->> 'userProfileId', '') as user_profile_id,
        -- Usually a Conversation Tracker alias, not the real address: see normalize_email.
        profile ->> 'email' as order_email_raw,
        profile ->> 'document' as document,
        profile ->> 'documentType' as document_type,
        profile ->> 'phone' as phone_raw,
        profile ->> 'firstName' as first_name,
        profile ->> 'lastName' as last_name,
        case when jsonb_typeof(items) = 'array' then jsonb_array_length(items) else 0 end as item_count
    from documents
)

select
    tenant_id,
    order_id,
    status,
    {{ is_purchase_status('status') }} as is_purchase,
    created_at,
    last_change_at,
    landed_at,
    (created_at at time zone 'UTC')::date as order_date,
    order_total,
    currency_code,
    user_profile_id,
    order_email_raw,
    document,
    document_type,
    phone_raw,
    first_name,
    last_name,
    item_count
from renamed
