-- The churn bands put to the test (docs/analyst.md, Churn risk): each customer's band as of the
-- holdout's calibration date (var as_of minus var churn_holdout_days), by the same macro as
-- churn_risk, from the purchase summary and a BG/NBD fit as of that date (the Python step
-- holdout_predictions), beside whether the customer bought again from then to as_of. The
-- repurchase rate must fall from low to lost: the ranking test and the Dagster metadata of
-- this model report it per tenant.
with purchase_summary as (
    select * from {{ ref('int_customers__holdout_summary') }}
    where {{ tenant_filter() }}
),

predictions as (
    select * from {{ source('analytics_python', 'holdout_predictions') }}
    where {{ tenant_filter() }}
),

bands as (
    {{ churn_bands() }}
),

holdout_buyers as (
    select distinct
        tenant_id,
        customer_key
    from {{ ref('int_orders__purchases') }}
    where {{ tenant_filter() }}
        and is_purchase
        and order_date > {{ holdout_calibration_date() }}
        and order_date <= {{ as_of_date() }}
)

select
    bands.tenant_id,
    bands.customer_key,
    {{ holdout_calibration_date() }} as calibration_date,
    bands.churn_band,
    bands.p_alive,
    holdout_buyers.customer_key is not null as repurchased
from bands
left join holdout_buyers
    on bands.tenant_id = holdout_buyers.tenant_id
    and bands.customer_key = holdout_buyers.customer_key
