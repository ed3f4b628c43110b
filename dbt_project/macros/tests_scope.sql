{#-
    The relation a generic test reads: with a `where` config, only its rows (dbt's own
    behaviour), and in a run scoped to some tenants, only their rows. A tenant's refresh then
    tests what it built, not every tenant's tables (seconds instead of a scan of all of them),
    and one tenant's bad rows fail only that tenant's runs. A run over all tenants tests all.
-#}
{% macro get_where_subquery(relation) -%}
    {%- set filters = [] -%}
    {%- set where = config.get('where') -%}
    {%- if where -%}
        {%- do filters.append('(' ~ where ~ ')') -%}
    {%- endif -%}
    {%- if tenant_ids_var() is not none -%}
        {%- do filters.append(tenant_filter()) -%}
    {%- endif -%}
    {%- if filters -%}
        {%- do return('(select * from ' ~ relation ~ ' where ' ~ filters | join(' and ') ~ ') dbt_subquery') -%}
    {%- else -%}
        {%- do return(relation) -%}
    {%- endif -%}
{%- endmacro %}
