-- Lost customers worth winning back: churn band 'lost' and past revenue above their
-- tenant's median customer revenue.
with customers as (
    select * from {{ ref('customers') }}
    where {{ tenant_filter() }}
),

churn_risk as (
    select * from {{ ref('churn_risk') }}
    where {{ tenant_filter() }}
),

tenant_medians as (
    select
        tenant_id,
        (percentile_cont(0.5) within group (order by revenue))::numeric(18, 2) as tenant_median_revenue
    from customers
    group by tenant_id
)

select
    {{ audience_identity_columns('customers') }},
    churn_risk.churn_band,
    churn_risk.days_since_last_purchase,
    customers.purchases,
    customers.revenue,
    tenant_medians.tenant_median_revenue
from churn_risk
inner join customers
    on churn_risk.tenant_id = customers.tenant_id
    and churn_risk.customer_key = customers.customer_key
inner join tenant_medians
    on customers.tenant_id = tenant_medians.tenant_id
where churn_risk.churn_band = 'lost'
    and customers.revenue > tenant_medians.tenant_median_revenue
