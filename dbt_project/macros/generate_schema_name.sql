{#-
    Where a model is built. Target prod: exactly the folder's `+schema` (staging,
    intermediate, marts, audiences), the fixed names the Dagster assets, activation and its
    sensors read. Any other target (dev, a person's): the target's schema as a prefix
    (DBT_SCHEMA_PREFIX, e.g. dev_alice_marts), so nothing it builds lands where production
    reads. Nodes without a custom schema (unit-test fixtures) use the target's schema.
-#}
{% macro generate_schema_name(custom_schema_name, node) -%}
    {%- if target.name == 'prod' -%}
        {{ (custom_schema_name or target.schema) | trim }}
    {%- else -%}
        {{ person_schema_prefix() }}{{ '_' ~ custom_schema_name | trim if custom_schema_name }}
    {%- endif -%}
{%- endmacro %}


{#- The dev target's schema, checked: a plain lower-case identifier, and none the platform
    writes itself. -#}
{% macro person_schema_prefix() -%}
    {%- set prefix = target.schema -%}
    {%- set platform_schemas = [
        'staging', 'intermediate', 'marts', 'audiences', 'analytics', 'analytics_python',
        'raw_vtex', 'cdp', 'public',
    ] -%}
    {%- if modules.re.fullmatch('[a-z_][a-z0-9_]{0,39}', prefix) is none or prefix in platform_schemas -%}
        {{ exceptions.raise_compiler_error(
            "DBT_SCHEMA_PREFIX must be a lower-case identifier of at most 40 characters other"
            ~ " than the platform's own schemas (got " ~ prefix[:60] ~ "), e.g. dev_alice"
        ) }}
    {%- endif -%}
    {{ prefix }}
{%- endmacro %}
