-- Customers who opted in to the newsletter in Master Data (their latest CL document) and
-- have a usable e-mail address.
with customers as (
    select * from {{ ref('customers') }}
    where {{ tenant_filter() }}
        and is_newsletter_opt_in
        and email is not null
)

select
    {{ audience_identity_columns('customers') }},
    customers.last_purchase_at,
    customers.purchases,
    customers.revenue
from customers
