{#-
    A table's rows are sound, in one test node: no two rows share the `key`; the `key` and
    `not_null` columns are never NULL; every one of `rules` (SQL expressions over a row) is true,
    a NULL counting as false; and with `customers`, every row's (tenant_id, customer_key) is a
    row of that relation, the row's own tenant's customer (stricter than dbt's relationships,
    which accepts another tenant's). dbt's unique, not_null, accepted_values, expression_is_true
    and relationships tests were a node each: a refresh's tests cost per node (compile,
    schedule, run, report) far more than per query, and a table carried up to nine.

    Fails with the key of each offending row and what is wrong with it, once per problem.
    Where the table keeps `key` as its own (key_index with unique: a unique index on exactly
    those columns, each NOT NULL), the server holds the uniqueness on every write and the test
    does not group the rows again.
-#}
{% test keyed_rows(model, key, not_null=[], rules=[], customers=none) %}
{%- set required = key + (not_null | reject('in', key) | list) -%}
{#- Each check as (a condition true on a failing row, the problem it names). -#}
{%- set checks = [] -%}
{%- for column in required -%}
    {%- do checks.append((column ~ ' is null', column ~ ' is null')) -%}
{%- endfor -%}
{%- for rule in rules -%}
    {%- do checks.append(('not coalesce(' ~ rule ~ ', false)', 'not true: ' ~ rule | trim)) -%}
{%- endfor -%}
{%- set key_columns = key | join(', ') %}
-- Read once per part below, each on its own plan (materialized, it would be copied first).
with tested_rows as not materialized (
    select * from {{ model }}
),

rows_with_problems as (
    select
        {{ key_columns }},
        unnest(array[
            {%- for condition, problem in checks %}
            case when {{ condition }} then {{ sql_literal(problem) }} end{{ ',' if not loop.last }}
            {%- endfor %}
        ]) as problem
    from tested_rows
    where {{ checks | map('first') | join('\n        or ') }}
)

select {{ key_columns }}, problem
from rows_with_problems
where problem is not null
{%- if not table_key_is(key) %}

union all

select {{ key_columns }}, 'key more than once' as problem
from tested_rows
group by {{ key_columns }}
having count(*) > 1
{%- endif %}
{%- if customers is not none %}

union all

select {{ key_columns }}, 'not a customer of its tenant' as problem
from tested_rows
where not exists (
    select from {{ customers }} as customers
    where customers.tenant_id = tested_rows.tenant_id
        and customers.customer_key = tested_rows.customer_key
)
{%- endif %}
{% endtest %}
