{#- The value of `col` on the first row in `order_by` order where it is not NULL (an aggregate). -#}
{% macro first_non_null(col, order_by) -%}
    (array_agg({{ col }} order by {{ order_by }}) filter (where {{ col }} is not null))[1]
{%- endmacro %}
