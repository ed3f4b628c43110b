{#-
    Audiences: one materialized view per audience, every tenant in it (tenant_id column),
    refreshed without keeping readers waiting. An audience is defined by its members and their reason columns;
    the identifier columns are the same everywhere and come from here.
-#}

{#-
    Every audience materialized view, for audience_catalog and the tests. A singular test
    (audience_models_listed) fails when a materialized view in models/audiences is missing.
-#}
{% macro audience_models() -%}
    {{ return([
        'audience_rfm_champions',
        'audience_rfm_loyal_customers',
        'audience_rfm_potential_loyalists',
        'audience_rfm_new_customers',
        'audience_rfm_promising',
        'audience_rfm_need_attention',
        'audience_rfm_about_to_sleep',
        'audience_rfm_at_risk',
        'audience_rfm_cant_lose_them',
        'audience_rfm_hibernating',
        'audience_rfm_lost',
        'audience_high_clv',
        'audience_high_churn_risk',
        'audience_win_back',
        'audience_new_customers',
        'audience_newsletter_subscribers',
    ]) }}
{%- endmacro %}


{#-
    The identifier columns of every audience, from a `customers` mart row aliased `alias`,
    normalized and hashed the way ad platforms match them (SHA-256, lower-case hex), by the
    mart (models/marts/customers.sql): e-mail normalized (trimmed, lower-case, real
    address); phone E.164 with its '+' (the Google form; activation derives other platforms'
    forms from phone_e164 in the mart); names lower-case without punctuation, accents kept.
    Country and external_id are sent in clear, never hashed. NULL stays NULL (no hash of an
    empty string).
-#}
{% macro audience_identity_columns(alias) -%}
    {{ alias }}.tenant_id,
    {{ alias }}.customer_key,
    {{ alias }}.email_sha256,
    {{ alias }}.phone_sha256,
    {{ alias }}.first_name_sha256,
    {{ alias }}.last_name_sha256,
    {{ alias }}.country,
    {{ alias }}.customer_key as external_id
{%- endmacro %}


{#-
    The whole SQL of one RFM segment audience (models/audiences/audience_rfm_*.sql are one
    call each): the segment's members with their scores as reason columns.
    No as_of or tenant var in here: a materialized view keeps the SQL it was created with
    and is only refreshed afterwards, so every date-dependent value comes from the marts.
-#}
{% macro rfm_audience(segment) %}
with customers as (
    select * from {{ ref('customers') }}
),

segment_members as (
    select * from {{ ref('rfm_segments') }}
    where segment = {{ sql_literal(segment) }}
)

select
    {{ audience_identity_columns('customers') }},
    segment_members.segment,
    segment_members.r_score,
    segment_members.f_score,
    segment_members.m_score,
    segment_members.recency_days,
    segment_members.frequency,
    segment_members.monetary
from segment_members
inner join customers
    on segment_members.tenant_id = customers.tenant_id
    and segment_members.customer_key = customers.customer_key
{% endmacro %}
