{#-
    Pre-hook of every tenant-scoped incremental model (delete+insert, unique_key tenant_id).

    dbt's delete+insert only deletes the tenant_id values present in the new batch, so a
    tenant whose rows all disappear (e.g. it fell below the RFM minimum) would keep stale
    rows. This hook first deletes exactly the rows in scope: the tenants the var names, or
    everything when it is not set. It runs inside the model's transaction, before the insert,
    so readers see the old rows until the commit, and other tenants' rows are never touched.

    A full refresh with a tenant var is refused (refuse_partial_full_refresh).
-#}
{% macro delete_tenant_rows() %}
    {{- refuse_partial_full_refresh() -}}
    {%- if is_incremental() -%}
        delete from {{ this }} where {{ tenant_filter() }}
    {%- endif -%}
{% endmacro %}

{# Fresh planner statistics after a tenant's rows were replaced: without them the next
   model plans against the old row counts (seen: a 4,500-customer tenant's `customers`
   took two minutes on nested loops; a few seconds after ANALYZE). Tables only. #}
{% macro analyze_if_table() %}
    {%- if config.get('materialized') in ('incremental', 'table') -%}
        analyze {{ this }}
    {%- endif -%}
{% endmacro %}

{#- A full refresh rebuilds the table from the model's SQL, which with a tenant var holds those
    tenants only: that would wipe the others, so it is refused. -#}
{% macro refuse_partial_full_refresh() %}
    {%- if should_full_refresh() and tenant_ids_var() is not none -%}
        {{ exceptions.raise_compiler_error(
            "--full-refresh with var tenant_id would drop every other tenant's rows of "
            ~ this ~ "; run the full refresh without tenant_id"
        ) }}
    {%- endif -%}
{% endmacro %}


{#-
    The raw documents a staging model has to parse, as a query over `raw_relation` (aliased
    `landed`): on an incremental run, those that landed (were inserted or changed: raw
    synced_at) since the model parsed them; otherwise every document in scope.

    Raw rows are never deleted, so "no staged row with this key and landing time" is exactly
    the work left. It is looked for only among the documents landed since shortly before the
    tenant's last refresh that staged any (its staged_at): an index on (tenant_id, synced_at)
    finds them, where checking every document read the whole raw table (a million orders) to
    find the day's few thousand. Those landed earlier had committed before that refresh read,
    and it staged them: the landing stamps a row in the statement that writes it and commits
    at once (cdp_assets/lib/upsert.py), and the lookback (var staging_lookback_minutes)
    covers that moment. A table staged before it had staged_at is checked whole, once.

    Each tenant's time is written into the query as a constant: from a join or a subquery the
    planner cannot tell how many rows follow it, and reads the whole table.
-#}
{% macro landed_since_staged(raw_relation, key) -%}
    {%- if is_incremental() -%}
        {%- set landed_from = landed_from_by_tenant(raw_relation) -%}
        select * from {{ raw_relation }} as landed
        where (
            {%- for tenant_id, since in landed_from.items() %}
            {{ "or " if not loop.first }}(landed.tenant_id = {{ sql_literal(tenant_id) }}
                {%- if since is not none %} and landed.synced_at >= to_timestamp({{ since | int }}){% endif %})
            {%- else %}
            false
            {%- endfor %}
        )
            and not exists (
                select from {{ this }} as staged
                where staged.tenant_id = landed.tenant_id
                    and staged.{{ key }} = landed.{{ key }}
                    and staged.landed_at = landed.synced_at
            )
    {%- else -%}
        select * from {{ raw_relation }} as landed
        where {{ tenant_filter('landed.tenant_id') }}
    {%- endif -%}
{%- endmacro %}


{#-
    tenant -> where its new documents start (Unix seconds: the lookback before the last
    refresh that staged any), or none to read all of its documents: for the tenants in scope
    with documents in `raw_relation`, queried when the model runs.
-#}
{% macro landed_from_by_tenant(raw_relation) -%}
    {%- if not execute -%}
        {{ return({}) }}
    {%- endif -%}
    {%- set tenant_ids = tenant_ids_var() -%}
    {%- if tenant_ids is none -%}
        {%- set tenant_ids = run_query(tenants_with_rows(raw_relation)).columns[0].values() -%}
    {%- endif -%}
    {%- set landed_from = {} -%}
    {%- for tenant_id in tenant_ids -%}
        {%- do landed_from.update({tenant_id: none}) -%}
    {%- endfor -%}
    {%- set staged_columns = adapter.get_columns_in_relation(this) | map(attribute='name') | list -%}
    {%- if 'staged_at' in staged_columns and tenant_ids | length > 0 -%}
        {%- set last_refreshes -%}
            select
                tenant_id,
                floor(extract(epoch from max(staged_at)))::bigint
                    - 60 * {{ var('staging_lookback_minutes') | int }}
            from {{ this }}
            where {{ tenant_filter() }} and staged_at is not null
            group by tenant_id
        {%- endset -%}
        {%- for row in run_query(last_refreshes).rows if row[0] in landed_from -%}
            {%- do landed_from.update({row[0]: row[1]}) -%}
        {%- endfor -%}
    {%- endif -%}
    {{ return(landed_from) }}
{%- endmacro %}


{#-
    The tenants with rows in `relation`, whose primary key starts with tenant_id: found by
    skipping through that key, one index probe per tenant, not a read of the table.
-#}
{% macro tenants_with_rows(relation) -%}
    with recursive found (tenant_id) as (
        (select tenant_id from {{ relation }} order by tenant_id limit 1)
        union all
        select (
            select following.tenant_id from {{ relation }} as following
            where following.tenant_id > found.tenant_id
            order by following.tenant_id
            limit 1
        )
        from found
        where found.tenant_id is not null
    )
    select tenant_id from found where tenant_id is not null
{%- endmacro %}
