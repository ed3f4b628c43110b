-- RFM scores and the 11 named segments per customer, as of as_of (docs/analyst.md, RFM segments).
-- R = days since the last purchase, F = purchase days (same-day orders are one purchase,
-- as in the BG/NBD inputs; counting orders would reward VTEX's per-seller order splits),
-- M = revenue. Scores are per-tenant quintiles from percent_rank (ties share a score).
-- Tenants with fewer customers than var rfm_min_customers (20) get no rows: quintiles of a
-- handful of customers are noise, and a lone customer would score 1/1/1 = "Lost".
--
-- Incremental: the ranks are the tenant's, so a refresh scores every customer of the tenant
-- again (set-based: a sort per score), but writes only the rows whose figures, scores or
-- segment moved, and deletes those of customers no longer scored (macro rfm_changed_rows, the
-- pre-hook). A day's orders move few customers across a quintile boundary; rewriting every
-- row of the tenant cost more than ranking it.
{{ config(meta={'rows_rebuilt': 'changed_scores'}, pre_hook="{{ rfm_changed_rows() }}") }}
-- depends_on: {{ ref('int_customers__purchase_summary') }}
{% if is_incremental() %}
select * from rfm_scored as scored
where not exists (
    select from {{ this }} as kept
    where kept.tenant_id = scored.tenant_id and kept.customer_key = scored.customer_key
)
{% else %}
    {{ rfm_scores() }}
{% endif %}
