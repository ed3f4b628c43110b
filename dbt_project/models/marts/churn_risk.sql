-- Churn band per customer as of as_of (docs/analyst.md, Churn risk), deterministic
-- and explainable first, refined by the model's P(alive) where that is informative.
--
-- Heuristic band (level 0-3 = low, medium, high, lost):
-- - 2+ purchase days: overdue_ratio = days since last purchase / own mean gap
--   (first to last day / (purchase days - 1)): < 1.5 low, < 2 medium, < 3 high, else lost.
-- - 1 purchase day: days since that purchase against the tenant's time-to-second-order
--   percentiles (customers who did reorder): < p50 low, < p80 medium, < p95 high, else
--   lost. With fewer than var churn_min_repeaters repeaters the percentiles are noise, and
--   var churn_fallback_gap_days (90/180/365) stands in. typical_gap_days is then p50.
--
-- Refinement: when the Python step fitted BG/NBD (model 'bgnbd_gamma_gamma') and the
-- customer repeated (x > 0), P(alive) gives a band too (>= 0.7 low, >= 0.4 medium,
-- >= 0.15 high, else lost) and moves the heuristic band one step towards it. One step at
-- most: the heuristic stays the explainable anchor, and on CDNOW very low P(alive) was
-- unreliable (frequent buyers whose P(alive) collapsed still rebought at 43 %). x = 0
-- customers have P(alive) = 1 by construction, and the 'heuristic' fallback adds nothing the
-- gaps do not already say, so neither refines. No predictions (a tenant not fitted yet):
-- the heuristic band alone.
with customers as (
    select * from {{ ref('customers') }}
    where {{ tenant_filter() }}
),

-- Every customer who bought by as_of: the tenant's reorder gaps are over all of them.
purchase_summary as (
    select * from {{ ref('int_customers__purchase_summary') }}
    where {{ tenant_filter() }}
),

predictions as (
    select * from {{ source('analytics_python', 'customer_predictions') }}
    where {{ tenant_filter() }}
),

bands as (
    {{ churn_bands() }}
)

-- One row per customer of the customers mart (the same population by construction).
-- Reading the population from `customers` also makes it a parent of this model: with
-- indirect_selection buildable (dbt_project.yml), a selection of everything but churn_risk
-- (the per-tenant Dagster asset that runs before the predictions) then leaves out
-- churn_risk's keyed_rows test too, instead of testing a churn_risk not rebuilt yet.
select bands.*
from bands
inner join customers
    on bands.tenant_id = customers.tenant_id
    and bands.customer_key = customers.customer_key
