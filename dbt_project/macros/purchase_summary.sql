{#-
    The purchase summary as of a date (an SQL date expression): one row per customer with a
    purchase on or before it, the counts, revenue and BG/NBD / Gamma-Gamma inputs
    (analytics.md §2.1, §5.1). Orders collapse to purchase days first (lifetimes and
    pymc-marketing do the same; VTEX also splits one checkout into one order per seller), so
    same-day orders are one purchase for frequency_x and their spend is summed.

    One macro for today's summary and the churn holdout's, so both follow the same rules.

    Customers suppressed in their tenant (a privacy request: cdp.privacy_suppressions holds
    the SHA-256 of their normalized e-mail, E.164 phone or document) are left out, whichever
    of their identity records carries the identifier: they are then in no mart and no
    audience, even when the store sends their data again. Their orders stay in
    int_orders__purchases, the store's order figures.
-#}
{% macro purchase_summary(as_of) %}
with suppressions as (
    select tenant_id, identifier_sha256 from {{ source('cdp', 'privacy_suppressions') }}
    where {{ tenant_filter() }}
),

-- Each record's keys are hashed once, and only in a tenant that has suppressions.
suppressed_customers as (
    select distinct record_keys.tenant_id, record_keys.customer_key
    from {{ ref('int_identity__customer_keys') }} as record_keys
    cross join lateral (
        values (record_keys.email_normalized), (record_keys.phone_e164),
            (record_keys.document_normalized)
    ) as identifiers (identifier)
    where {{ tenant_filter('record_keys.tenant_id') }}
        and record_keys.tenant_id in (select tenant_id from suppressions)
        and (record_keys.tenant_id, {{ sha256_hex('identifiers.identifier') }})
            in (select tenant_id, identifier_sha256 from suppressions)
),

purchases as (
    select * from {{ ref('int_orders__purchases') }}
    where {{ tenant_filter() }}
        and is_purchase
        and order_date <= {{ as_of }}
        and (tenant_id, customer_key) not in (select tenant_id, customer_key from suppressed_customers)
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
    coalesce(avg(day_spend) filter (where day_number > 1), 0)::numeric(18, 2) as mean_repeat_spend
from purchase_days
group by tenant_id, customer_key
{% endmacro %}
