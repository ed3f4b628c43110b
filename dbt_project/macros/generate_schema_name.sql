{#-
    Schemas are exactly the folder's `+schema` (staging, intermediate, marts, audiences), not
    dbt's default `<target schema>_<custom schema>`: other code (the Dagster assets, the
    activation step, analysts) addresses the relations by these fixed names. Nodes without a
    custom schema (tests storing failures, unit-test fixtures) use the profile's schema.
-#}
{% macro generate_schema_name(custom_schema_name, node) -%}
    {%- if custom_schema_name is none -%}
        {{ target.schema }}
    {%- else -%}
        {{ custom_schema_name | trim }}
    {%- endif -%}
{%- endmacro %}
