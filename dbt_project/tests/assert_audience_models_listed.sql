-- Every materialized view under models/audiences must be listed in audience_models()
-- (macros/audiences.sql), or audience_catalog and the tenant test would silently skip it.
-- Returns the missing model names.
{%- set listed = audience_models() %}
{%- set missing = [] %}
{%- if execute %}
    {%- for node in graph.nodes.values() %}
        {%- if node.resource_type == 'model' and node.config.materialized == 'materialized_view'
            and node.name not in listed %}
            {%- do missing.append(node.name) %}
        {%- endif %}
    {%- endfor %}
{%- endif %}

select model_name
from (values ('')
    {%- for name in missing %}, ({{ sql_literal(name) }}){% endfor %}
) as audience_models (model_name)
where model_name <> ''
