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
    the work left. Only the documents landed since shortly before the tenant's newest staged
    one are checked: the index on (tenant_id, synced_at) finds them, where checking every
    document read the whole raw table (a million orders) to find the day's few thousand. The
    lookback (var staging_lookback_minutes) covers a landing stamped before that newest row
    but committed after the model read: the landing stamps a row in the statement that
    writes it and commits at once (cdp_assets/lib/upsert.py).
-#}
{% macro landed_since_staged(raw_relation, key) -%}
    {%- if is_incremental() -%}
        select landed.*
        from ({{ tenants_in(raw_relation) }}) as scope
        cross join lateral (
            select max(staged.landed_at)
                - make_interval(mins => {{ var('staging_lookback_minutes') | int }}) as since
            from {{ this }} as staged
            where staged.tenant_id = scope.tenant_id
        ) as watermark
        inner join {{ raw_relation }} as landed
            on landed.tenant_id = scope.tenant_id
            and landed.synced_at >= coalesce(watermark.since, '-infinity')
        where not exists (
            select from {{ this }} as staged
            where staged.tenant_id = landed.tenant_id
                and staged.landed_at = landed.synced_at
                and staged.{{ key }} = landed.{{ key }}
        )
    {%- else -%}
        select * from {{ raw_relation }} as landed
        where {{ tenant_filter('landed.tenant_id') }}
    {%- endif -%}
{%- endmacro %}


{#-
    The tenants in scope: the tenant_id var's, or else every tenant with rows in `relation`
    (whose primary key starts with tenant_id), found by skipping through that key: one index
    probe per tenant, not a read of the table.
-#}
{% macro tenants_in(relation) -%}
    {%- set tenant_ids = tenant_ids_var() -%}
    {%- if tenant_ids is none -%}
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
    {%- else -%}
        select tenant_id from (values
            {%- for tenant_id in tenant_ids %}
            ({{ sql_literal(tenant_id) }}){{ "," if not loop.last }}
            {%- endfor %}
        ) as tenant_ids (tenant_id)
    {%- endif -%}
{%- endmacro %}
