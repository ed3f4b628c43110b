{{ config(materialized='view', indexes=[]) }}

-- Members per audience and tenant, zeros included, over every audience (each model of
-- models/audiences/: macro audience_models()).
with memberships as (
    {% for audience in audience_models() %}
        select
            {{ sql_literal(audience) }} as audience,
            tenant_id,
            count(*) as members
        from {{ ref(audience) }}
        group by tenant_id
        {% if not loop.last %}union all{% endif %}
    {% endfor %}
),

audiences as (
    select audience
    from unnest(array[
            {%- for audience in audience_models() %}
                {{ sql_literal(audience) }}{{ "," if not loop.last }}
            {%- endfor %}
        ]) as audience_list (audience)
),

-- Tenants from the customers table, not the stg_cdp__tenants view: every tenant run
-- recreates that view, and dropping its old copy cascades to views built on it.
tenants as (
    select distinct tenant_id from {{ ref('customers') }}
)

select
    audiences.audience,
    tenants.tenant_id,
    coalesce(memberships.members, 0)::integer as members
from audiences
cross join tenants
left join memberships
    on audiences.audience = memberships.audience
    and tenants.tenant_id = memberships.tenant_id
