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
    Join of the staging models that parse raw documents (the raw relation aliased `alias`): on
    an incremental run, only the raw rows that landed (were inserted or changed: raw synced_at)
    since the model parsed them. Raw rows are never deleted, so "no staged row with this key
    and landing time" is exactly the work left, whatever order rows landed in and however long
    ago the model last ran. Parsing every document again on each refresh was most of a
    refresh's time.

    The search compares keys alone: the raw primary key's index holds synced_at (migration
    0010) and this table's landed_index the other side, so it is a merge of two index-only
    scans, and only the rows it finds are read from the raw table, by primary key. Filtering
    the raw rows themselves read every one of them from the heap (a million orders: 0.8 s
    against 0.4 s).
-#}
{% macro landed_since_staged(raw_relation, alias, key) -%}
    {%- if is_incremental() -%}
    inner join (
        select landed.tenant_id, landed.{{ key }}
        from {{ raw_relation }} as landed
        where {{ tenant_filter('landed.tenant_id') }}
            and not exists (
                select from {{ this }} as staged
                where staged.tenant_id = landed.tenant_id
                    and staged.{{ key }} = landed.{{ key }}
                    and staged.landed_at = landed.synced_at
            )
    ) as landed_keys
        on {{ alias }}.tenant_id = landed_keys.tenant_id
        and {{ alias }}.{{ key }} = landed_keys.{{ key }}
    {%- endif -%}
{%- endmacro %}


{#- Pre-hook (inside the transaction) of the same staging tables on an incremental run: no
    parallel plans for the search above. With parallel workers the planner prefers hashing the
    whole staged table in several processes (a million orders: 0.6 s on two) to the merge of
    the two indexes (0.4 s on one), while dbt's other threads are waiting for the same cores.
    A first build reads every document and keeps its parallel plans. -#}
{% macro serial_landed_search() -%}
    {%- if is_incremental() -%}
        set local max_parallel_workers_per_gather = 0
    {%- endif -%}
{%- endmacro %}


{#- The pre-hook (outside the transaction) of the staging tables landed_since_staged joins:
    VACUUM of their raw table (meta raw_table), so that the search can read its primary
    key's index alone (migration 0010), and ANALYZE of the columns it reads (meta raw_key), so
    that the planner knows how few rows it finds and reads them by primary key: with no
    statistics it expected a fifth of the table and read the whole heap into a hash (9,000
    landed orders of a million: 5.0 s against 0.5 s). The index-only scan consults the
    table's visibility map, never its TOAST table, where the documents are: that part (5 GB
    of a million orders) is left to autovacuum, and ANALYZE reads no document. Rendered at
    execution only: at parse time the model's meta is not resolved yet. -#}
{% macro vacuum_raw_table() -%}
    {%- if execute -%}
        {%- set meta = config.get('meta') -%}
        vacuum (analyze, process_toast false) {{ source('raw_vtex', meta['raw_table']) }}
            (tenant_id, {{ meta['raw_key'] }}, synced_at)
    {%- endif -%}
{%- endmacro %}


{#- The post-hook beside it: this table's unique key and landing time indexed, the other side
    of the anti-join (and what delete+insert's delete finds the replaced rows by). -#}
{% macro landed_index() -%}
    {%- if execute -%}
        {{ key_index(config.get('unique_key') + ['landed_at']) }}
    {%- endif -%}
{%- endmacro %}


{#-
    A post-hook: an index for reading a table's rows by key, created once and kept through
    every incremental run (dbt's `indexes` config builds one only with a new table, under a new
    name each time).
-#}
{% macro key_index(columns) -%}
    create index if not exists {{ this.identifier }}_{{ columns | join('_') }}_idx
        on {{ this }} ({{ columns | join(', ') }})
{%- endmacro %}


{#-
    `columns` (comma-separated) as this incremental model's table holds them, each one it
    lacks as NULL of `data_type`: on_schema_change adds a new column only after the model's
    query ran, so the first run after an upgrade reads NULL (and rebuilds what depends on it).
-#}
{% macro built_columns(columns, data_type) -%}
    {%- set built = adapter.get_columns_in_relation(this) | map(attribute='name') | list -%}
    {%- for column in columns -%}
        {%- if column in built -%}
            {{ column }}
        {%- else -%}
            null::{{ data_type }} as {{ column }}
        {%- endif -%}
        {{- ', ' if not loop.last -}}
    {%- endfor -%}
{%- endmacro %}
