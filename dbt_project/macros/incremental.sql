{#-
    Pre-hook of every model (dbt_project.yml), the first inside its transaction: an incremental
    table's rows of the run's tenants are written by one build at a time. Two builds of one
    tenant's model (two people, a person and the platform, whatever starts them) would
    otherwise both delete the old rows and both append: the second's delete cannot see the
    rows the first has not committed yet, and the tenant's rows double. The second now waits
    for the first to commit, then replaces its rows. Advisory locks held until the model's
    transaction ends, per table (its full name: prod and dev tables never wait for each
    other) and tenant: a build of every tenant takes the table's lock exclusively, one of some
    tenants shares it and takes theirs, in one order (sorted) so that builds never deadlock.
-#}
{% macro serialize_tenant_writes() -%}
    {%- if config.get('materialized') == 'incremental' -%}
        {%- set table_key = 'hashtext(' ~ sql_literal(this | string) ~ ')' -%}
        {%- set tenant_ids = tenant_ids_var() -%}
        {%- if tenant_ids is none -%}
            select pg_advisory_xact_lock({{ table_key }})
        {%- else -%}
            select pg_advisory_xact_lock_shared({{ table_key }})
            {%- for tenant_id in tenant_ids -%}
                , pg_advisory_xact_lock({{ table_key }}, hashtext({{ sql_literal(tenant_id) }}))
            {%- endfor %}
        {%- endif -%}
    {%- endif -%}
{%- endmacro %}


{#-
    Pre-hook of every tenant-scoped incremental model (strategy append): it deletes exactly
    the rows in scope, the tenants the var names or everything when it is not set, and the
    append then inserts the fresh ones. A tenant whose rows all disappear (e.g. it fell below
    the RFM minimum) keeps nothing stale, which delete+insert keyed on tenant_id would not
    give: it deletes only the tenants present in the new batch. It runs inside the model's
    transaction, after its locks (serialize_tenant_writes) and before the insert, so readers
    see the old rows until the commit, no other build of the tenant is between the delete and
    the insert, and other tenants' rows are never touched.

    A full refresh with a tenant var is refused (refuse_partial_full_refresh).
-#}
{% macro delete_tenant_rows() %}
    {{- refuse_partial_full_refresh() -}}
    {#- A model that deletes only the rows it rebuilds (macro changed_customers_scope) says so
        in meta rows_rebuilt. -#}
    {%- if is_incremental() and not config.get('meta', {}).get('rows_rebuilt') -%}
        delete from {{ this }} where {{ tenant_filter() }}
    {%- endif -%}
{% endmacro %}

{#- Fresh planner statistics after a build that changed much of its tenants' rows: without
    them the next model plans against the old row counts (seen: a 4,500-customer tenant's
    `customers` took two minutes on nested loops; a few seconds after ANALYZE). An ANALYZE
    samples 30,000 rows however few changed, 0.5 to 2.5 s a table on a refresh's critical
    path, so a build that wrote under a tenth of the rows the planner expects of its tenants
    leaves them to autovacuum. Rows written: this transaction's count of the table
    (pg_stat_xact_user_tables), a row deleted and inserted again counted once. The rows
    expected: the planner's own estimate for each of the run's tenants (EXPLAIN: the
    statistics scaled to the table's pages now; a tenant they do not know is the average of
    the rest, or one row), or for the whole table when the run covers every tenant. A table
    without statistics is analyzed.

    A run over several tenants is also weighed tenant by tenant: the run's writes are weighed
    against all its tenants together, so a tenant new to the statistics beside a large one
    would stay at the planner's one-row guess, and the next join over its rows nest once per
    row (seen: 35,000 members read in minutes, not milliseconds). The table is analyzed when a
    tenant's rows now exceed both ten times its estimate and stale_tenant_rows. Only a tenant
    whose estimate is under a ninth of the rows written can have outgrown it in this run, and
    its rows are counted only up to that bound. A run over every tenant is weighed as a whole.
    Tables only, inside the model's transaction. -#}
{% macro analyze_if_stale() %}
    {%- if config.get('materialized') in ('incremental', 'table') -%}
        {#- Under this many rows, even a nested loop over a tenant's rows costs milliseconds. -#}
        {%- set stale_tenant_rows = 1000 -%}
        {%- set tenant_ids = tenant_ids_var() -%}
        do $analyze$
        declare
            target regclass := {{ sql_literal(this | string) }};
            tenant_ids text[] := array[
                {%- for tenant_id in tenant_ids or [] -%}
                    {{ sql_literal(tenant_id) }}{{ ", " if not loop.last }}
                {%- endfor -%}
            ]::text[];
            written numeric;
            expected numeric := 0;
            estimates numeric[] := array[]::numeric[];
            tenant_rows numeric;
            bound numeric;
            plan json;
        begin
            if not exists (
                select from pg_stats
                where schemaname = {{ sql_literal(this.schema) }}
                    and tablename = {{ sql_literal(this.identifier) }}
                    and attname = 'tenant_id'
            ) then
                analyze {{ this }};
                return;
            end if;
            select coalesce(sum(greatest(n_tup_ins, n_tup_del) + n_tup_upd), 0) into written
            from pg_stat_xact_user_tables
            where relid = target;
            {%- if tenant_ids is none %}
            execute format('explain (format json) select from %s', target) into plan;
            expected := (plan -> 0 -> 'Plan' ->> 'Plan Rows')::numeric;
            {%- else %}
            for i in 1 .. cardinality(tenant_ids) loop
                execute format(
                    'explain (format json) select from %s where tenant_id = %L',
                    target,
                    tenant_ids[i]
                ) into plan;
                estimates[i] := (plan -> 0 -> 'Plan' ->> 'Plan Rows')::numeric;
                expected := expected + estimates[i];
            end loop;
            {%- endif %}
            if written > expected / 10 then
                analyze {{ this }};
                return;
            end if;
            if written < {{ stale_tenant_rows }} then
                return;
            end if;
            for i in 1 .. cardinality(tenant_ids) loop
                continue when estimates[i] * 9 >= written;
                bound := greatest(10 * estimates[i], {{ stale_tenant_rows }});
                execute format(
                    'select count(*) from (select from %s where tenant_id = %L limit %s) as kept',
                    target,
                    tenant_ids[i],
                    bound + 1
                ) into tenant_rows;
                if tenant_rows > bound then
                    analyze {{ this }};
                    return;
                end if;
            end loop;
        end
        $analyze$
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
    The raw rows a staging model that parses raw documents reads (`raw_relation`): on an
    incremental run, only those that landed (were inserted or changed: raw synced_at) since
    the model parsed them. Raw rows are never deleted, so "no staged row with this key and
    landing time" is exactly the work left, whatever order rows landed in and however long
    ago the model last ran. Parsing every document again on each refresh was most of a
    refresh's time.

    The search compares keys alone: the raw primary key's index holds synced_at (migration
    0010) and this table's landed_index the other side, so it is a merge of two index-only
    scans. Only the rows it finds are then read from the raw table, each by primary key. The
    two OFFSET 0 keep the planner to that order: left to join the raw table as it saw fit, it
    read the whole heap for the few thousand landed orders of a million.
-#}
{% macro landed_since_staged(raw_relation, key) -%}
    {%- if is_incremental() -%}
    (
        select documents.*
        from (
            select landed.tenant_id, landed.{{ key }}
            from {{ raw_relation }} as landed
            where {{ tenant_filter('landed.tenant_id') }}
                and not exists (
                    select from {{ this }} as staged
                    where staged.tenant_id = landed.tenant_id
                        and staged.{{ key }} = landed.{{ key }}
                        and staged.landed_at = landed.synced_at
                )
            limit all offset 0
        ) as landed_keys
        cross join lateral (
            select * from {{ raw_relation }} as raw_row
            where raw_row.tenant_id = landed_keys.tenant_id
                and raw_row.{{ key }} = landed_keys.{{ key }}
            limit all offset 0
        ) as documents
    )
    {%- else -%}
    {{ raw_relation }}
    {%- endif -%}
{%- endmacro %}


{#- Pre-hook (inside the transaction) of the same staging tables on an incremental run: no
    parallel plans for the search above. With parallel workers the planner prefers hashing the
    whole staged table in several processes to the merge of the two indexes, which is faster
    on one, while dbt's other threads are waiting for the same cores.
    A first build reads every document and keeps its parallel plans. -#}
{% macro serial_landed_search() -%}
    {%- if is_incremental() -%}
        set local max_parallel_workers_per_gather = 0
    {%- endif -%}
{%- endmacro %}


{#- A post-hook (after the commit) of the staging tables read through landed_since_staged:
    VACUUM of their raw table (meta raw_table), so that the next build's anti-join can read
    its primary key's index alone (migration 0010), but for the pages that changed since. The
    index-only scan consults the table's visibility map, never its TOAST table, where the
    documents are: that part (5 GB of a million orders) is left to autovacuum. Rendered at
    execution only: at parse time the model's meta is not resolved yet. Production's builds
    only: the raw tables are the platform's, and a person's build reads them, nothing more. -#}
{% macro vacuum_raw_table() -%}
    {%- if execute and target.name == 'prod' -%}
        vacuum (process_toast false) {{ source('raw_vtex', config.get('meta')['raw_table']) }}
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
    name each time). `unique`: the columns are the table's key, unique and never NULL (a
    write that would repeat one or leave one NULL fails), so the model's uniqueness test of
    them needs no scan (tests/generic/keyed_rows.sql). Setting NOT NULL scans the table,
    once.
-#}
{% macro key_index(columns, unique=false) -%}
    {{ index_once(
        this.identifier ~ '_' ~ columns | join('_') ~ '_idx',
        ('unique ' if unique else '') ~ 'index',
        '(' ~ columns | join(', ') ~ ')',
    ) }}
    {%- if unique %};
    {#- Only where one is not yet: ALTER TABLE locks out the table's readers meanwhile. #}
    do $key$ begin
        if exists (
            select 1 from pg_attribute
            where attrelid = {{ sql_literal(this | string) }}::regclass and not attnotnull
                and attname in ({% for column in columns %}{{ sql_literal(column) }}{{ ', ' if not loop.last }}{% endfor %})
        ) then
            alter table {{ this }}
            {%- for column in columns %}
                alter column {{ column }} set not null{{ ',' if not loop.last }}
            {%- endfor %};
        end if;
    end $key$
    {%- endif %}
{%- endmacro %}


{#-
    `create <kind> <name> on <the model's table> <columns>` unless an index of that name is
    there. CREATE INDEX IF NOT EXISTS locks the table against writes before it looks: two
    builds writing the table at once (two tenants' refreshes, an analyst's prod build beside
    the platform's) each waited in it for the other's transaction to end, a deadlock. Looking
    first takes no lock once the index exists.
-#}
{% macro index_once(name, kind, columns) -%}
    do $index$ begin
        if to_regclass(format('%I.%I', {{ sql_literal(this.schema) }}, {{ sql_literal(name) }})) is null then
            create {{ kind }} if not exists {{ adapter.quote(name) }} on {{ this }} {{ columns }};
        end if;
    end $index$
{%- endmacro %}


{#-
    Whether the table a test is attached to has a valid unique index on exactly `columns` (no
    expression, no predicate, no included column), every one of them NOT NULL: a unique index
    does not compare NULLs, which the uniqueness test counts as equal. The test's `model`
    argument is a query over the table (get_where_subquery), not the table: here `model` is
    the test itself, whose attached node names the table.
-#}
{% macro table_key_is(columns) %}
    {%- if not execute or not model.attached_node -%}
        {{ return(false) }}
    {%- endif -%}
    {%- set tested = graph.nodes[model.attached_node] -%}
    {%- set key_sql -%}
        select count(*)
        from pg_index as i
        inner join pg_class as c on c.oid = i.indrelid
        inner join pg_namespace as n on n.oid = c.relnamespace
        where n.nspname = {{ sql_literal(tested.schema) }}
            and c.relname = {{ sql_literal(tested.alias) }}
            and i.indisunique and i.indisvalid and i.indpred is null and i.indexprs is null
            and i.indnatts = {{ columns | length }}
            and (
                select array_agg(a.attname::text order by a.attname)
                from pg_attribute as a
                where a.attrelid = c.oid and a.attnum = any(i.indkey) and a.attnotnull
            ) = array[{% for column in columns | sort %}{{ sql_literal(column) }}{{ ', ' if not loop.last }}{% endfor %}]::text[]
    {%- endset -%}
    {{ return(run_query(key_sql).columns[0].values()[0] > 0) }}
{% endmacro %}


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


{#-
    Incremental strategy `tenant_rows_changed` (the audiences): the run's tenants' rows become
    the model's new rows (the temporary relation dbt built from its SQL), writing only what
    differs. A refresh after a few orders moves a few members of an audience of tens of
    thousands: replacing them all was most of the audiences' refresh. A stored row with an
    identical new row (same key, every column equal) stays; the other stored rows go, and the
    new rows with no identical stored row are inserted, so a query that gives one key twice
    still fails on the table's unique key. Columns compare as text, so that any type compares,
    and NULL equals NULL; the keys compare with `=`, so that both searches can hash. Rows of
    other tenants (in the query, or stored) are not touched; readers see the old rows until
    the commit. A column dropped from the model keeps its old values in the rows that stay.
-#}
{% macro get_incremental_tenant_rows_changed_sql(arg_dict) %}
    {%- set target = arg_dict['target_relation'] -%}
    {%- set fresh = arg_dict['temp_relation'] -%}
    {%- set keys = arg_dict['unique_key'] -%}
    {%- set keys = [keys] if keys is string else keys -%}
    {%- if not keys -%}
        {{ exceptions.raise_compiler_error(
            "incremental_strategy tenant_rows_changed needs the model's unique_key"
        ) }}
    {%- endif -%}
    {%- set columns = arg_dict['dest_columns'] | map(attribute='quoted') | list -%}
    delete from {{ target }} as kept
    where {{ tenant_filter('kept.tenant_id') }}
        and not exists (
            select from {{ fresh }} as fresh
            where {{ same_row('fresh', 'kept', keys, columns) }}
        );
    insert into {{ target }} ({{ columns | join(', ') }})
    select {{ columns | join(', ') }}
    from {{ fresh }} as fresh
    where {{ tenant_filter('fresh.tenant_id') }}
        and not exists (
            select from {{ target }} as kept
            where {{ tenant_filter('kept.tenant_id') }}
                and {{ same_row('fresh', 'kept', keys, columns) }}
        )
{% endmacro %}


{#- Whether rows `left` and `right` (aliases) are the same: equal keys, every column equal as
    text (NULL equal to NULL). -#}
{% macro same_row(left, right, keys, columns) -%}
    {%- for key in keys %}
    {{ left }}.{{ adapter.quote(key) }} = {{ right }}.{{ adapter.quote(key) }} and
    {%- endfor %}
    {%- for column in columns %}
    {{ left }}.{{ column }}::text is not distinct from {{ right }}.{{ column }}::text
    {{- ' and' if not loop.last }}
    {%- endfor %}
{%- endmacro %}
