{#- Every row satisfies `expression` (rows where it is false or NULL fail). Model- or column-level. -#}
{% test expression_is_true(model, expression, column_name=none) %}
    select *
    from {{ model }}
    where not coalesce({{ expression }}, false)
{% endtest %}
