-- Customers in the 'high' churn band: overdue but not yet lost, the window where a
-- retention offer still pays.
with customers as (
    select * from {{ ref('customers') }}
    where {{ tenant_filter() }}
),

churn_risk as (
    select * from {{ ref('churn_risk') }}
    where {{ tenant_filter() }}
        and churn_band = 'high'
)

select
    {{ audience_identity_columns('customers') }},
    churn_risk.churn_band,
    churn_risk.days_since_last_purchase,
    churn_risk.typical_gap_days,
    churn_risk.overdue_ratio,
    churn_risk.p_alive,
    customers.revenue
from churn_risk
inner join customers
    on churn_risk.tenant_id = customers.tenant_id
    and churn_risk.customer_key = customers.customer_key
