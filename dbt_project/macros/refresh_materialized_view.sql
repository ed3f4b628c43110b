{#-
    Overrides dbt-postgres' `postgres__refresh_materialized_view` (a plain
    `refresh materialized view`), which dbt calls for an existing materialized view whose
    indexes did not change. Two reasons:

    1. Readers must not block. A plain REFRESH takes an ACCESS EXCLUSIVE lock for the whole
       refresh, so every reader of an audience (an activation push, audience_catalog) waits
       until it ends. REFRESH ... CONCURRENTLY takes an EXCLUSIVE lock instead: reads go on
       against the old contents while the new ones are computed and diffed in. Postgres
       allows it only when the view is populated and has a unique index on plain columns
       without a WHERE clause; the audiences get one from their `indexes` config
       (tenant_id, customer_key). When either does not hold (a view created WITH NO DATA by
       hand, an index dropped) this falls back to the plain refresh rather than fail.

    2. SQL changes must not be lost. dbt-postgres compares only the indexes of an existing
       materialized view, so after a change to an audience's SQL it would keep refreshing
       the old query forever. The post-hook `record_materialized_view_sql` stores an md5 of
       the compiled SQL in the view's comment; when it differs from the SQL being run (or is
       missing), the view is replaced (built under a temporary name, swapped in) instead.
-#}
{% macro postgres__refresh_materialized_view(relation) %}
    {%- set state = {'populated': false, 'unique_index': false, 'sql_md5': none} -%}
    {%- if execute -%}
        {%- set state_sql -%}
            select
                m.ispopulated,
                exists (
                    select 1
                    from pg_index as i
                    where i.indrelid = c.oid
                        and i.indisunique
                        and i.indisvalid
                        and i.indpred is null
                        and i.indexprs is null
                ) as has_unique_index,
                substring(obj_description(c.oid, 'pg_class') from 'dbt_sql_md5:([0-9a-f]{32})') as sql_md5
            from pg_matviews as m
            inner join pg_namespace as n on n.nspname = m.schemaname
            inner join pg_class as c on c.relnamespace = n.oid and c.relname = m.matviewname
            where m.schemaname = {{ sql_literal(relation.schema) }}
                and m.matviewname = {{ sql_literal(relation.identifier) }}
        {%- endset -%}
        {%- set result = run_query(state_sql) -%}
        {%- if result | length > 0 -%}
            {%- do state.update({
                'populated': result.columns[0].values()[0],
                'unique_index': result.columns[1].values()[0],
                'sql_md5': result.columns[2].values()[0],
            }) -%}
        {%- endif -%}
    {%- endif -%}

    {%- if execute and state.sql_md5 != local_md5(sql) -%}
        {{ log("SQL of " ~ relation ~ " changed since it was created: replacing it", info=true) }}
        {%- set existing_relation = adapter.get_relation(relation.database, relation.schema, relation.identifier) -%}
        {#- The replace drops the old view with CASCADE, which also drops views built on it
            (audience_catalog). Tell dbt's relation cache, as adapter.drop_relation would, so
            that those are created afresh later in the run instead of failing on a relation
            the cache still believes exists. #}
        {%- do adapter.cache_dropped(existing_relation) -%}
        {%- do adapter.cache_added(relation) -%}
        {{ get_replace_sql(existing_relation, relation, sql) }}
    {%- elif state.populated and state.unique_index -%}
        refresh materialized view concurrently {{ relation }}
    {%- else -%}
        {%- if execute -%}
            {{ log("Plain (blocking) refresh of " ~ relation ~ ": not populated or no unique index", info=true) }}
        {%- endif %}
        refresh materialized view {{ relation }}
    {%- endif -%}
{% endmacro %}


{#-
    Post-hook of the audience materialized views: remember which SQL the view was built
    from (see above). COMMENT takes a SHARE UPDATE EXCLUSIVE lock, which readers do not
    conflict with. A no-op for models that are not materialized views (audience_catalog).
-#}
{% macro record_materialized_view_sql() %}
    {%- if config.get('materialized') == 'materialized_view' -%}
        comment on materialized view {{ this }} is {{ sql_literal('dbt_sql_md5:' ~ local_md5(sql)) }}
    {%- endif -%}
{% endmacro %}
