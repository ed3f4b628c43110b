{#-
    Audiences: one table per audience, every tenant in it (tenant_id column), refreshed one
    tenant (or a few) at a time: a refresh makes the run's tenants' rows the query's in one
    transaction, writing only those that changed (strategy tenant_rows_changed,
    incremental.sql), so a reader sees a tenant's old members or its new ones, never none, and
    no other tenant's rows are touched. An audience is
    defined by its members and their reason columns; the identifier columns are the same
    everywhere and come from here.
-#}

{#-
    Every audience: each model of models/audiences/ but audience_catalog, for the catalog and
    the tests that read all of them. A model's dependencies are fixed when dbt parses it, and
    nothing then lists a folder (dbt-core#1212), so the platform and `cdp dbt` pass the
    folder's models in env var CDP_AUDIENCE_MODELS (analytics/dbt_files.py,
    audience_model_names): a new audience needs no list of its own.
-#}
{% macro audience_models() -%}
    {%- set listed = env_var('CDP_AUDIENCE_MODELS', '') -%}
    {%- if not listed -%}
        {{ exceptions.raise_compiler_error(
            "CDP_AUDIENCE_MODELS is not set: run dbt as `cdp dbt ARGS`, which lists the"
            ~ " audiences of models/audiences/ in it"
        ) }}
    {%- endif -%}
    {{ return(listed.split(',')) }}
{%- endmacro %}


{#-
    Pre-hook of the audiences folder. Activation reads an audience by tenant_id and
    customer_key, one tenant at a time: every audience is a table refreshed per tenant
    (incremental, rows of the run's tenants replaced) with an enforced contract declaring at
    least those columns. dbt itself then checks the query's columns against the contract.
-#}
{% macro enforce_audience_contract() -%}
    {%- if execute and model.name in audience_models() -%}
        {%- set declared = model.columns.values() | selectattr('data_type') | map(attribute='name') | list -%}
        {%- set missing = ['tenant_id', 'customer_key'] | reject('in', declared) | list -%}
        {%- set contract = config.get('contract') -%}
        {%- if config.get('materialized') != 'incremental' or not contract.enforced or missing -%}
            {{ exceptions.raise_compiler_error(
                "audience " ~ model.name ~ " must be an incremental table with an enforced contract"
                ~ " declaring (with data_type) at least tenant_id and customer_key"
                ~ (" (missing: " ~ missing | join(', ') ~ ")" if missing else "")
                ~ ": declare it in models/audiences/_audiences__models.yml (docs/analyst.md, Add an audience)"
            ) }}
        {%- endif -%}
    {%- endif -%}
{%- endmacro %}


{#-
    Post-hook of the audiences: marks the table as built by dbt from this SQL (its comment),
    which is how activation tells a dbt audience no model declares any more (a branch's, a
    dropped one: nothing refreshes it) from a table someone made by hand. COMMENT takes a
    SHARE UPDATE EXCLUSIVE lock, which readers do not conflict with. A no-op for the catalog
    (a view).
-#}
{% macro record_audience_sql() %}
    {%- if config.get('materialized') == 'incremental' -%}
        comment on table {{ this }} is {{ sql_literal('dbt_sql_md5:' ~ local_md5(sql)) }}
    {%- endif -%}
{% endmacro %}


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
    The run's tenants only (var tenant_id); every date-dependent value comes from the marts,
    built as of the same day.
-#}
{% macro rfm_audience(segment) %}
with customers as (
    select * from {{ ref('customers') }}
    where {{ tenant_filter() }}
),

segment_members as (
    select * from {{ ref('rfm_segments') }}
    where {{ tenant_filter() }}
        and segment = {{ sql_literal(segment) }}
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
