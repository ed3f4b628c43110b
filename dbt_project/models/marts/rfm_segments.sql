-- RFM scores and the 11 named segments per customer, as of as_of (analytics.md §1.3, §5).
-- R = days since the last purchase, F = purchase days (same-day orders are one purchase,
-- as in the BG/NBD inputs; counting orders would reward VTEX's per-seller order splits),
-- M = revenue. Scores are per-tenant quintiles from percent_rank (ties share a score).
-- Tenants with fewer customers than var rfm_min_customers (20) get no rows: quintiles of a
-- handful of customers are noise, and a lone customer would score 1/1/1 = "Lost".
with purchase_summary as (
    select * from {{ ref('int_customers__purchase_summary') }}
    where {{ tenant_filter() }}
),

rfm_values as (
    select
        tenant_id,
        customer_key,
        age_t_days - recency_t_x_days as recency_days,
        purchase_days as frequency,
        revenue as monetary,
        count(*) over (partition by tenant_id) as tenant_customers
    from purchase_summary
),

scored as (
    select
        tenant_id,
        customer_key,
        recency_days,
        frequency,
        monetary,
        -- Reversed: the most recent customers get 5.
        {{ rfm_score('recency_days desc') }} as r_score,
        {{ rfm_score('frequency') }} as f_score,
        {{ rfm_score('monetary') }} as m_score
    from rfm_values
    where tenant_customers >= {{ var('rfm_min_customers') | int }}
),

combined as (
    select
        *,
        -- Integer division floors: (4 + 5) / 2 = 4.
        (f_score + m_score) / 2 as fm_score
    from scored
)

select
    tenant_id,
    customer_key,
    recency_days,
    frequency,
    monetary,
    r_score,
    f_score,
    m_score,
    fm_score,
    {{ rfm_segment('r_score', 'fm_score') }} as segment
from combined
