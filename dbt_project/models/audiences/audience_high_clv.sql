-- Customers in the top 20 % of predicted 1-year CLV of their tenant (ties at the edge are
-- in). Tenants the Python step has not fitted yet have no members; customers with no
-- predicted value (clv_1y = 0) never count as "high". Predictions of keys that are no
-- longer customers (identity changed since the fit) are ignored.
with customers as (
    select * from {{ ref('customers') }}
    where {{ tenant_filter() }}
),

predictions as (
    select * from {{ source('analytics_python', 'customer_predictions') }}
    where {{ tenant_filter() }}
        and clv_1y > 0
),

ranked as (
    select
        {{ audience_identity_columns('customers') }},
        predictions.clv_1y,
        predictions.clv_3y,
        predictions.p_alive,
        predictions.model as prediction_model,
        -- Share of the tenant's customers with a clv_1y at least this high.
        cume_dist() over (partition by customers.tenant_id order by predictions.clv_1y desc)
            as clv_1y_top_share
    from predictions
    inner join customers
        on predictions.tenant_id = customers.tenant_id
        and predictions.customer_key = customers.customer_key
)

select
    tenant_id,
    customer_key,
    email_sha256,
    phone_sha256,
    first_name_sha256,
    last_name_sha256,
    country,
    external_id,
    clv_1y,
    clv_3y,
    p_alive,
    prediction_model,
    round(clv_1y_top_share::numeric, 4) as clv_1y_top_share
from ranked
where clv_1y_top_share <= 0.2
