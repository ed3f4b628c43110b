{#-
    Churn bands (the rules are documented in models/marts/churn_risk.sql) from two CTEs the
    calling model defines: `purchase_summary` (int_customers__purchase_summary rows as of
    the date, every customer who bought by then: the tenant's reorder gaps are over all of
    them) and `predictions` (the Python step's P(alive) as of it). One macro for today's bands
    (churn_risk) and the bands as of the holdout's calibration date (churn_holdout), so the
    holdout validates the same rules.
-#}
{% macro churn_bands() %}
with tenant_reorder_gaps as (
    select
        tenant_id,
        count(*) as repeaters,
        percentile_cont(0.50) within group (order by second_purchase_date - first_purchase_date) as p50_days,
        percentile_cont(0.80) within group (order by second_purchase_date - first_purchase_date) as p80_days,
        percentile_cont(0.95) within group (order by second_purchase_date - first_purchase_date) as p95_days
    from purchase_summary
    where second_purchase_date is not null
    group by tenant_id
),

{%- set fallback = var('churn_fallback_gap_days') %}
gap_thresholds as (
    select
        tenants.tenant_id,
        case when gaps.repeaters >= {{ var('churn_min_repeaters') | int }} then gaps.p50_days else {{ fallback[0] | float }} end as p50_days,
        case when gaps.repeaters >= {{ var('churn_min_repeaters') | int }} then gaps.p80_days else {{ fallback[1] | float }} end as p80_days,
        case when gaps.repeaters >= {{ var('churn_min_repeaters') | int }} then gaps.p95_days else {{ fallback[2] | float }} end as p95_days
    from (select distinct tenant_id from purchase_summary) as tenants
    left join tenant_reorder_gaps as gaps on tenants.tenant_id = gaps.tenant_id
),

heuristic as (
    select
        purchase_summary.tenant_id,
        purchase_summary.customer_key,
        purchase_summary.frequency_x,
        purchase_summary.age_t_days - purchase_summary.recency_t_x_days as days_since_last_purchase,
        case
            when purchase_summary.purchase_days >= 2
                then purchase_summary.recency_t_x_days::numeric / (purchase_summary.purchase_days - 1)
            else gap_thresholds.p50_days::numeric
        end as typical_gap_days,
        gap_thresholds.p50_days,
        gap_thresholds.p80_days,
        gap_thresholds.p95_days,
        purchase_summary.purchase_days
    from purchase_summary
    inner join gap_thresholds on purchase_summary.tenant_id = gap_thresholds.tenant_id
),

levels as (
    select
        heuristic.tenant_id,
        heuristic.customer_key,
        heuristic.days_since_last_purchase,
        heuristic.typical_gap_days,
        heuristic.days_since_last_purchase / nullif(heuristic.typical_gap_days, 0) as overdue_ratio,
        predictions.p_alive,
        case
            when heuristic.purchase_days >= 2 then
                case
                    when heuristic.days_since_last_purchase < 1.5 * heuristic.typical_gap_days then 0
                    when heuristic.days_since_last_purchase < 2 * heuristic.typical_gap_days then 1
                    when heuristic.days_since_last_purchase < 3 * heuristic.typical_gap_days then 2
                    else 3
                end
            else
                case
                    when heuristic.days_since_last_purchase < heuristic.p50_days then 0
                    when heuristic.days_since_last_purchase < heuristic.p80_days then 1
                    when heuristic.days_since_last_purchase < heuristic.p95_days then 2
                    else 3
                end
        end as heuristic_level,
        case
            when predictions.model = 'bgnbd_gamma_gamma' and heuristic.frequency_x > 0 then
                case
                    when predictions.p_alive >= 0.7 then 0
                    when predictions.p_alive >= 0.4 then 1
                    when predictions.p_alive >= 0.15 then 2
                    else 3
                end
        end as model_level
    from heuristic
    left join predictions
        on heuristic.tenant_id = predictions.tenant_id
        and heuristic.customer_key = predictions.customer_key
)

select
    tenant_id,
    customer_key,
    days_since_last_purchase,
    round(typical_gap_days, 1) as typical_gap_days,
    round(overdue_ratio, 2) as overdue_ratio,
    p_alive,
    (array['low', 'medium', 'high', 'lost'])[
        1 + heuristic_level + coalesce(sign(model_level - heuristic_level)::integer, 0)
    ] as churn_band
from levels
{% endmacro %}
