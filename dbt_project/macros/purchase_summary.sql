{#-
    The purchase summary as of a date (an SQL date expression): one row per customer with a
    purchase on or before it, the counts, revenue and BG/NBD / Gamma-Gamma inputs
    (Fader, Hardie & Lee 2005). Orders collapse to purchase days first (lifetimes and
    pymc-marketing do the same; VTEX also splits one checkout into one order per seller), so
    same-day orders are one purchase for frequency_x and their spend is summed.

    One macro for today's summary and the churn holdout's, so both follow the same rules.
    `changed_only`: the rows of the customers in changed_customers only on an incremental run
    (macro changed_customers_scope, today's summary).

    Customers suppressed in their tenant (a privacy request: cdp.privacy_suppressions holds
    the SHA-256 of their normalized e-mail, E.164 phone or document) are left out, whichever
    of their identity records carries the identifier: they are then in no mart and no
    audience, even when the store sends their data again. Their orders stay in
    int_orders__purchases, the store's order figures.
-#}
{% macro purchase_summary(as_of, changed_only=false) %}
with suppressions as (
    select tenant_id, identifier_sha256 from {{ source('cdp', 'privacy_suppressions') }}
    where {{ tenant_filter() }}
),

suppressed_customers as (
    {{ suppressed_customers('suppressions') }}
),

purchases as (
    select * from {{ ref('int_orders__purchases') }} as purchases
    where {{ tenant_filter() }}
        and is_purchase
        and order_date <= {{ as_of }}
        and (tenant_id, customer_key) not in (select tenant_id, customer_key from suppressed_customers)
        {%- if changed_only %}
        and {{ in_changed_customers('purchases') }}
        {%- endif %}
),

purchase_days as (
    select
        tenant_id,
        customer_key,
        order_date as purchase_date,
        count(*) as orders,
        min(created_at) as first_created_at,
        max(created_at) as last_created_at,
        coalesce(sum(order_total), 0) as day_spend,
        row_number() over (partition by tenant_id, customer_key order by order_date) as day_number
    from purchases
    group by tenant_id, customer_key, order_date
)

select
    tenant_id,
    customer_key,
    {{ as_of }} as as_of,
    sum(orders)::integer as orders,
    count(*)::integer as purchase_days,
    min(purchase_date) as first_purchase_date,
    max(purchase_date) as last_purchase_date,
    min(first_created_at) as first_purchase_at,
    max(last_created_at) as last_purchase_at,
    sum(day_spend)::numeric(18, 2) as revenue,
    -- BG/NBD inputs in days: x = repeat purchase days, t_x = first to last day,
    -- T = first day to as_of; m_x = mean spend of the repeat days (0 when x = 0).
    (count(*) - 1)::integer as frequency_x,
    (max(purchase_date) - min(purchase_date))::integer as recency_t_x_days,
    ({{ as_of }} - min(purchase_date))::integer as age_t_days,
    -- The tenant's time to a second purchase (churn_bands) comes from here, not from a sort
    -- of every purchase day.
    min(purchase_date) filter (where day_number = 2) as second_purchase_date,
    coalesce(avg(day_spend) filter (where day_number > 1), 0)::numeric(18, 2) as mean_repeat_spend,
    -- When this run built the row (macro changed_customers_scope).
    now() as built_at
from purchase_days
group by tenant_id, customer_key
{% endmacro %}
