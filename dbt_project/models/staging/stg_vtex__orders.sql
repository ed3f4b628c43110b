-- One row per order: the Get-order document flattened, money from integer cents to units.
with orders as (
    select * from {{ source('raw_vtex', 'orders') }}
),

renamed as (
    select
        tenant_id,
        order_id,
        payload ->> 'status' as status,
        -- creation_date / change_stamp are the landed copies of creationDate / lastChange,
        -- already timestamptz (VTEX's 7 fractional digits rounded to microseconds).
        creation_date as created_at,
        change_stamp as last_change_at,
        -- A value that is not a JSON number (the landing rejects those) becomes NULL
        -- instead of failing the whole view.
        case
            when jsonb_typeof(payload -> 'value') = 'number'
                then ((payload ->> 'value')::numeric / 100)::numeric(18, 2)
        end as order_total,
        payload -> 'storePreferencesData' ->> 'currencyCode' as currency_code,
        nullif(payload -> 'clientProfileData' ->> 'userProfileId', '') as user_profile_id,
        -- Usually a Conversation Tracker alias, not the real address: see normalize_email.
        payload -> 'clientProfileData' ->> 'email' as order_email_raw,
        payload -> 'clientProfileData' ->> 'document' as document,
        payload -> 'clientProfileData' ->> 'documentType' as document_type,
        payload -> 'clientProfileData' ->> 'phone' as phone_raw,
        payload -> 'clientProfileData' ->> 'firstName' as first_name,
        payload -> 'clientProfileData' ->> 'lastName' as last_name,
        case
            when jsonb_typeof(payload -> 'items') = 'array' then jsonb_array_length(payload -> 'items')
            else 0
        end as item_count
    from orders
)

select
    tenant_id,
    order_id,
    status,
    {{ is_purchase_status('status') }} as is_purchase,
    created_at,
    last_change_at,
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
