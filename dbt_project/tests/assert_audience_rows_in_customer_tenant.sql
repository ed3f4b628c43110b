-- Every audience row belongs to the tenant of its customer: an audience pushed for one
-- store must never carry another store's customers. Returns the offending rows.
{% for audience in audience_models() %}
    select
        {{ sql_literal(audience) }} as audience,
        audience_rows.tenant_id as audience_tenant_id,
        customers.tenant_id as customer_tenant_id,
        audience_rows.customer_key
    from {{ ref(audience) }} as audience_rows
    inner join {{ ref('customers') }} as customers
        on audience_rows.customer_key = customers.customer_key
    where audience_rows.tenant_id <> customers.tenant_id
    {% if not loop.last %}union all{% endif %}
{% endfor %}
