{#-
    The combination of `combination_of_columns` is unique (no dbt_utils here). Where the
    tested table keeps them as its key (key_index with unique: a unique index on exactly these
    columns, each NOT NULL), the server holds that on every write, and the test reads nothing:
    grouping the table by them cost seconds a run at seed scale (the order lines).
-#}
{% test unique_combination_of_columns(model, combination_of_columns) %}
    {%- if table_key_is(combination_of_columns) %}
    -- ({{ combination_of_columns | join(', ') }}) is the table's key: a unique index, NOT NULL.
    select null as rows_with_this_key where false
    {%- else %}
    select {{ combination_of_columns | join(', ') }}, count(*) as rows_with_this_key
    from {{ model }}
    group by {{ combination_of_columns | join(', ') }}
    having count(*) > 1
    {%- endif %}
{% endtest %}

