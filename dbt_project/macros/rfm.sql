{#-
    RFM scoring and segments (docs/analyst.md, RFM segments).
-#}

{#-
    A 1-5 quintile score per tenant from percent_rank(): customers with equal values share a
    score, so the result is deterministic without a tie-breaker. ntile() would split ties
    at random across buckets. Buckets can be uneven and a score can be skipped when many
    customers tie (e.g. one-order customers), which is the price of determinism.
    percent_rank() = 1 for the top customer: least(5, ...) keeps it at 5.
-#}
{% macro rfm_score(order_by) -%}
    least(5, 1 + floor(5 * percent_rank() over (partition by tenant_id order by {{ order_by }})))::integer
{%- endmacro %}


{#-
    The project's 5x5 (r_score, fm_score) table of docs/analyst.md (RFM segments), in the CASE's
    order below; total and non-overlapping, all 11 segments reachable:

      r\fm  1               2                   3                   4                5
      5     New Customers   Potential Loyalist  Potential Loyalist  Champions        Champions
      4     Promising       Potential Loyalist  Potential Loyalist  Loyal Customers  Loyal Customers
      3     About To Sleep  About To Sleep      Need Attention      Loyal Customers  Loyal Customers
      2     Hibernating     Hibernating         At Risk             At Risk          Can't Lose Them
      1     Lost            Lost                At Risk             At Risk          Can't Lose Them
-#}
{% macro rfm_segment(r, fm) -%}
    case
        when {{ r }} = 5 and {{ fm }} = 1 then 'New Customers'
        when {{ r }} = 5 and {{ fm }} in (2, 3) then 'Potential Loyalist'
        when {{ r }} = 5 then 'Champions'
        when {{ r }} = 4 and {{ fm }} = 1 then 'Promising'
        when {{ r }} = 4 and {{ fm }} in (2, 3) then 'Potential Loyalist'
        when {{ r }} = 4 then 'Loyal Customers'
        when {{ r }} = 3 and {{ fm }} <= 2 then 'About To Sleep'
        when {{ r }} = 3 and {{ fm }} = 3 then 'Need Attention'
        when {{ r }} = 3 then 'Loyal Customers'
        when {{ fm }} = 5 then 'Can''t Lose Them'
        when {{ fm }} >= 3 then 'At Risk'
        when {{ r }} = 2 then 'Hibernating'
        else 'Lost'
    end
{%- endmacro %}


{#-
    Every RFM score of the run's tenants (model rfm_segments): R = days since the last
    purchase, F = purchase days, M = revenue, each a per-tenant quintile (rfm_score); tenants
    with fewer customers than var rfm_min_customers get no rows.
-#}
{% macro rfm_scores() %}
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
{% endmacro %}


{#-
    The pre-hook of rfm_segments (inside its transaction, after its lock): on an incremental
    run, the temporary table `rfm_scored` holds every score of the run's tenants, and the rows
    of the table that differ from it (or that it no longer holds) are deleted; the model then
    inserts the scored rows the table lacks. Rows that did not move are neither deleted nor
    written again.
-#}
{% macro rfm_changed_rows() %}
    {%- if is_incremental() -%}
    {%- set columns = ['tenant_id', 'customer_key', 'recency_days', 'frequency', 'monetary',
        'r_score', 'f_score', 'm_score', 'fm_score', 'segment'] -%}
    drop table if exists rfm_scored;
    create temporary table rfm_scored on commit drop as {{ rfm_scores() }};
    analyze rfm_scored;
    {#- Every column is NOT NULL (the model's tests): equality compares them all. #}
    delete from {{ this }} as kept
    where {{ tenant_filter('kept.tenant_id') }}
        and not exists (
            select from rfm_scored as scored
            where {% for column in columns %}scored.{{ column }} = kept.{{ column }}{{ ' and ' if not loop.last }}{% endfor %}
        )
    {%- endif -%}
{% endmacro %}
