{#-
    The only way project vars reach SQL. A var is never pasted into SQL as it came: it is
    validated, then rendered as a quoted literal.
-#}

{#-
    A run's var: `--vars` (what an analyst types) or else, when executing, the JSON object in
    env var CDP_DBT_RUN_VARS (what Dagster's runs pass). dbt re-parses the whole project when
    `--vars` change (twice the start-up of an invocation), and every run has a new date or
    tenant list; an env var read only when executing is not part of the parse at all.
-#}
{% macro run_var(name) %}
    {%- set value = var(name, none) -%}
    {%- if value is none and execute -%}
        {%- set value = fromjson(env_var('CDP_DBT_RUN_VARS', '{}')).get(name) -%}
    {%- endif -%}
    {{ return(value) }}
{% endmacro %}


{#- A SQL string literal: single quotes doubled (standard_conforming_strings is on). -#}
{% macro sql_literal(value) -%}
    '{{ (value | string) | replace("'", "''") }}'
{%- endmacro %}


{#-
    The tenants in scope, validated: a list, or none when every tenant is built. The var is
    `tenant_id`, one id (`--vars '{tenant_id: acme}'`) or a list of ids (a run over several
    tenants' partitions builds them in one invocation).
-#}
{% macro tenant_ids_var() %}
    {%- set value = run_var('tenant_id') -%}
    {%- if value is none or value == '' or value == [] -%}
        {{ return(none) }}
    {%- endif -%}
    {%- set ids = [value] if value is string else value -%}
    {%- if ids is not iterable or ids is mapping -%}
        {{ exceptions.raise_compiler_error(
            "var tenant_id must be a tenant id or a list of them (got " ~ (value | string)[:80] ~ ")"
        ) }}
    {%- endif -%}
    {%- for tenant_id in ids -%}
        {#- fullmatch, not match with ^...$: Python's $ also matches before a trailing newline. -#}
        {%- if tenant_id is not string or modules.re.fullmatch('[a-z][a-z0-9_]{1,62}', tenant_id) is none -%}
            {{ exceptions.raise_compiler_error(
                "var tenant_id must match ^[a-z][a-z0-9_]{1,62}$ (got " ~ (tenant_id | string)[:80] ~ ")"
            ) }}
        {%- endif -%}
    {%- endfor -%}
    {{ return(ids | unique | sort) }}
{% endmacro %}


{#- `<column> in ('<tenant>', ...)` when the tenant_id var is set, else `true`. -#}
{% macro tenant_filter(column='tenant_id') -%}
    {%- set tenant_ids = tenant_ids_var() -%}
    {%- if tenant_ids is none -%}
        true
    {%- else -%}
        {{ column }} in (
            {%- for tenant_id in tenant_ids -%}
                {{ sql_literal(tenant_id) }}{{ ", " if not loop.last }}
            {%- endfor -%}
        )
    {%- endif -%}
{%- endmacro %}


{#-
    The as-of date: the `as_of` var (YYYY-MM-DD) as a date literal, else current_date.
    Models use this and never now()/current_date directly, so a run is reproducible.
-#}
{% macro as_of_date() -%}
    {%- set as_of = run_var('as_of') -%}
    {%- if as_of is none or as_of == '' -%}
        current_date
    {%- else -%}
        {#- YAML turns an unquoted 2026-11-30 into a date object; its string form is the same. -#}
        {%- set as_of_text = as_of | string -%}
        {%- if modules.re.fullmatch('[0-9]{4}-[0-9]{2}-[0-9]{2}', as_of_text) is none -%}
            {{ exceptions.raise_compiler_error(
                "var as_of must be a date YYYY-MM-DD (got " ~ as_of_text[:40] ~ ")"
            ) }}
        {%- endif -%}
        cast({{ sql_literal(as_of_text) }} as date)
    {%- endif -%}
{%- endmacro %}


{#-
    The churn holdout's calibration date: var as_of minus var churn_holdout_days. Bands are
    computed as of it and checked against who bought in the days after (marts.churn_holdout).
-#}
{% macro holdout_calibration_date() -%}
    ({{ as_of_date() }} - {{ var('churn_holdout_days') | int }})
{%- endmacro %}
