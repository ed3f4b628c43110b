{#- None of `columns` is NULL: the rows where any is, with those columns (dbt's not_null for
    several columns in one scan of the model; each test is a query and a node of its own, and
    a build spent more time running one test per column than building the models). -#}
{% test not_null_columns(model, columns) %}
    select {{ columns | join(', ') }}
    from {{ model }}
    where {% for column in columns %}{{ column }} is null{{ ' or ' if not loop.last }}{% endfor %}
{% endtest %}
