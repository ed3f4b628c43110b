-- Customers whose first purchase was at most var new_customer_days (30) days before the
-- as-of date of the last build: onboarding and second-purchase campaigns.
-- The age comes from the purchase summary (built as of the refresh's as_of), not from
-- current_date, so the audience agrees with the marts it was built from.
with customers as (
    select * from {{ ref('customers') }}
    where {{ tenant_filter() }}
),

purchase_summary as (
    select * from {{ ref('int_customers__purchase_summary') }}
    where {{ tenant_filter() }}
        and age_t_days <= {{ var('new_customer_days') | int }}
)

select
    {{ audience_identity_columns('customers') }},
    customers.first_purchase_at,
    purchase_summary.age_t_days as days_since_first_purchase,
    customers.purchases,
    customers.revenue
from purchase_summary
inner join customers
    on purchase_summary.tenant_id = customers.tenant_id
    and purchase_summary.customer_key = customers.customer_key
