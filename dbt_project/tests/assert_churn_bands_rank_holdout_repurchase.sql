{{ config(severity='warn') }}
-- The churn bands must rank who buys again: per tenant, the holdout's repurchase rate falls
-- from low to medium to high to lost. Returns every pair of bands, each with at least var
-- churn_holdout_min_band_customers customers (smaller ones are noise), where the riskier
-- band bought again more often. A warning, not an error: a store's history may be too short
-- or too odd for the rules, and its analytics should still be built.
with rates as (
    select
        tenant_id,
        churn_band,
        array_position(array['low', 'medium', 'high', 'lost'], churn_band) as risk,
        count(*) as customers,
        avg(repurchased::integer) as repurchase_rate
    from {{ ref('churn_holdout') }}
    where {{ tenant_filter() }}
    group by tenant_id, churn_band
    having count(*) >= {{ var('churn_holdout_min_band_customers') | int }}
)

select
    safer.tenant_id,
    safer.churn_band as safer_band,
    safer.repurchase_rate as safer_rate,
    riskier.churn_band as riskier_band,
    riskier.repurchase_rate as riskier_rate
from rates as safer
inner join rates as riskier
    on safer.tenant_id = riskier.tenant_id
    and safer.risk < riskier.risk
where riskier.repurchase_rate > safer.repurchase_rate
