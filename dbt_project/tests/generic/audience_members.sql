{#-
    An audience's members are sound: the `required_columns` are never NULL, a customer is a
    member once per tenant, and every member is a customer of the audience row's own tenant
    (`customers`): an audience pushed for one store must never carry another store's
    customers. One query and one node per audience, where dbt's not_null, unique and
    relationships tests were three: a refresh's tests cost per node (compile, schedule, run,
    report), not per query. Fails with each offending member and what is wrong with it.
-#}
{% test audience_members(model, customers, required_columns) %}
with members as (
    select * from {{ model }}
),

members_missing_values as (
    select tenant_id, customer_key, 'a required column is null' as problem
    from members
    where {% for column in required_columns %}{{ column }} is null{{ ' or ' if not loop.last }}{% endfor %}
),

members_more_than_once as (
    select tenant_id, customer_key, 'member more than once' as problem
    from members
    group by tenant_id, customer_key
    having count(*) > 1
),

members_not_customers_of_their_tenant as (
    select members.tenant_id, members.customer_key, 'not a customer of the tenant' as problem
    from members
    where not exists (
        select from {{ customers }} as customers
        where customers.tenant_id = members.tenant_id
            and customers.customer_key = members.customer_key
    )
)

select * from members_missing_values
union all
select * from members_more_than_once
union all
select * from members_not_customers_of_their_tenant
{% endtest %}
