-- One row per Master Data CL document: the customer's own profile, with the real e-mail.
{{ config(post_hook="{{ key_index(['tenant_id', 'customer_id'], unique=true) }}") }}
with customers as (
    select *
    from {{ landed_since_staged(source('raw_vtex', 'customers'), 'customer_id') }} as raw_customers
    where {{ tenant_filter('raw_customers.tenant_id') }}
)

select
    tenant_id,
    customer_id,
    nullif(payload ->> 'userId', '') as user_id,
    payload ->> 'email' as email_raw,
    payload ->> 'firstName' as first_name,
    payload ->> 'lastName' as last_name,
    payload ->> 'document' as document,
    payload ->> 'documentType' as document_type,
    payload ->> 'phone' as phone_raw,
    -- A flag that is not a JSON boolean becomes NULL instead of failing the whole view.
    case when jsonb_typeof(payload -> 'isNewsletterOptIn') = 'boolean'
            then (payload ->> 'isNewsletterOptIn')::boolean
    end as is_newsletter_opt_in,
    (payload ->> 'createdIn')::timestamptz as created_at,
    (payload ->> 'updatedIn')::timestamptz as updated_at,
    synced_at as landed_at
from customers
