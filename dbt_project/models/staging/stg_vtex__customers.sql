-- One row per Master Data CL document: the customer's own profile, with the real e-mail.
with customers as (
    select * from {{ source('raw_vtex', 'customers') }}
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
    (payload ->> 'isNewsletterOptIn')::boolean as is_newsletter_opt_in,
    (payload ->> 'createdIn')::timestamptz as created_at,
    (payload ->> 'updatedIn')::timestamptz as updated_at
from customers
