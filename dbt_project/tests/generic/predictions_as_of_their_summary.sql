{#-
    The model reads `predictions` (the Python step's fit, a source with an as_of column)
    beside `summary` (the purchase summary, as_of column): per tenant in scope, both must be as
    of the same day, or the model mixed a fit of one day into marts of another. Returns each
    tenant whose days differ, with both. A refresh fits and scores on one day; a person's
    build in dev as of a past day reads production's predictions, of today, and is told so.
-#}
{% test predictions_as_of_their_summary(model, predictions, summary) %}
with prediction_days as (
    select tenant_id, min(as_of) as first_day, max(as_of) as last_day
    from {{ predictions }}
    where {{ tenant_filter() }}
    group by tenant_id
),

summary_days as (
    select tenant_id, min(as_of) as first_day, max(as_of) as last_day
    from {{ summary }}
    where {{ tenant_filter() }}
    group by tenant_id
)

select
    prediction_days.tenant_id,
    prediction_days.first_day as predictions_as_of,
    summary_days.first_day as summary_as_of
from prediction_days
inner join summary_days on prediction_days.tenant_id = summary_days.tenant_id
where prediction_days.first_day <> summary_days.first_day
    or prediction_days.last_day <> summary_days.last_day
{% endtest %}
