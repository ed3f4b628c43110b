{#-
    The identity record an order belongs to: its buyer's profile (userProfileId), or the
    order itself when VTEX served no profile. Used by int_identity__records to build the
    records and by int_orders__purchases to find an order's customer: defined once here so
    the two can never disagree.
-#}
{% macro order_record_id(user_profile_id, order_id) -%}
    case
        when {{ user_profile_id }} is not null then 'profile:' || {{ user_profile_id }}
        else 'order:' || {{ order_id }}
    end
{%- endmacro %}


{#- A post-hook of stg_vtex__orders: its orders by identity record, on the expression of macro
    order_record_id itself, so that int_orders__purchases reads the orders of the few records
    rebuilt since its last build by index, not every order. -#}
{% macro order_record_index() -%}
    {{ index_once(
        this.identifier ~ '_record_id_idx',
        'index',
        '(tenant_id, (' ~ order_record_id('user_profile_id', 'order_id') ~ '))',
    ) }}
{%- endmacro %}


{#-
    The contact columns of an identity record, from a row aliased `alias` with email_raw,
    document, document_type, phone_raw, first_name and last_name (an order's contact or a
    Master Data document), normalized into identity keys; needs the tenant's `calling_code`
    joined as `tenants`.
-#}
{% macro normalized_contact_columns(alias) -%}
    {{ alias }}.email_raw,
    {{ normalize_email(alias ~ '.email_raw') }} as email_normalized,
    {{ normalize_document(alias ~ '.document') }} as document_normalized,
    lower(nullif(trim({{ alias }}.document_type), '')) as document_type,
    {{ alias }}.phone_raw,
    {{ normalize_phone_e164(alias ~ '.phone_raw', 'tenants.calling_code') }} as phone_e164,
    nullif(trim({{ alias }}.first_name), '') as first_name,
    nullif(trim({{ alias }}.last_name), '') as last_name
{%- endmacro %}


{#-
    Post-hook of int_identity__records: the order profiles none of whose orders belong to
    them any more (macro order_record_id: a profile record holds the orders with its
    userProfileId, a guest record `order:<orderId>` its one order while it has none). A guest
    order that gained a userProfileId moved to its profile's record; a profile's only order
    that lost it, to a record of its own. Two statements, so that each is a plain anti-join
    on columns.
-#}
{% macro delete_order_records_gone() %}
    {%- if is_incremental() -%}
        delete from {{ this }} as records
        where records.record_source = 'order_profile'
            and records.user_profile_id is not null
            and {{ tenant_filter('records.tenant_id') }}
            and not exists (
                select from {{ ref('stg_vtex__orders') }} as orders
                where orders.tenant_id = records.tenant_id
                    and orders.user_profile_id = records.user_profile_id
            );
        delete from {{ this }} as records
        where records.record_source = 'order_profile'
            and records.user_profile_id is null
            and {{ tenant_filter('records.tenant_id') }}
            and not exists (
                select from {{ ref('stg_vtex__orders') }} as orders
                where orders.tenant_id = records.tenant_id
                    and orders.order_id = records.source_id
                    and orders.user_profile_id is null
            )
    {%- endif -%}
{% endmacro %}


{#-
    One row per (record, identity key) of `relation` (rows with the identity columns of
    int_identity__records), the record named by its column `record_column`; each kind of key
    has its own prefix.
-#}
{% macro identity_keys(relation, record_column) -%}
    select tenant_id, {{ record_column }}, 'user_profile_id:' || user_profile_id as identity_key
    from {{ relation }}
    where user_profile_id is not null
    union all
    select tenant_id, {{ record_column }}, 'email:' || email_normalized
    from {{ relation }}
    where email_normalized is not null
    union all
    select tenant_id, {{ record_column }}, 'document:' || document_type || ':' || document_normalized
    from {{ relation }}
    where document_normalized is not null
    union all
    select tenant_id, {{ record_column }}, 'phone:' || phone_e164
    from {{ relation }}
    where phone_e164 is not null
{%- endmacro %}


{#- Post-hook of the incremental identity tables built from another (`upstream`): the rows whose
    `key` in their tenant is no longer in it (int_identity__customer_keys: records gone from
    int_identity__records; int_customers__profiles: customers gone from
    int_identity__customer_keys, merged into another or without records). -#}
{% macro delete_rows_gone(upstream, key) %}
    {%- if is_incremental() -%}
        delete from {{ this }} as built
        where {{ tenant_filter('built.tenant_id') }}
            and not exists (
                select from {{ upstream }} as upstream
                where upstream.tenant_id = built.tenant_id
                    and upstream.{{ key }} = built.{{ key }}
            )
    {%- endif -%}
{% endmacro %}


{#- The columns of an identity record that its keys come from (macro identity_keys). -#}
{% macro identity_key_column_names() -%}
    {{ return(['user_profile_id', 'email_normalized', 'document_type', 'document_normalized', 'phone_e164']) }}
{%- endmacro %}


{#- Those columns, comma-separated, each prefixed with `alias.`. -#}
{% macro identity_key_columns(alias) -%}
    {%- for column in identity_key_column_names() -%}
        {{ alias }}.{{ column }}{{ ', ' if not loop.last }}
    {%- endfor -%}
{%- endmacro %}


{#-
    Pre-hook of int_identity__customer_keys on an incremental run: which records to resolve
    again, in temporary tables the model reads (the session's, dropped by the next run), analyzed, so
    that the model is planned for the few records that changed. As CTEs of the model, the
    planner took the changes for as many rows as the tables and spilled a hash join into
    hundreds of thousands of batches for a few hundred changed records.

    - identity_changed_records: records whose identity keys differ from the ones stored with
      them when last resolved, new records, and records that are gone.
    - identity_touched_keys: every key a changed record has now or had then.
    - identity_resolution_scope: the changed records (those that still exist), every record
      holding a touched key, and every record of a customer one of those belonged to. That is
      a union of whole components no other record links to (a key linking a record inside to
      one outside would be a touched key, or would have put both in one customer before), so
      resolving it alone gives what resolving the whole tenant would.
    - identity_key_counts: records per key over the whole tenant, for the keys of the scope
      (a key's limit is on all its records, not only those in scope).
-#}
{% macro identity_resolution_scope() %}
    {%- if is_incremental() -%}
    {%- set records = ref('int_identity__records') -%}
    drop table if exists
        identity_changed_records, identity_touched_keys, identity_resolution_scope,
        identity_key_counts;
    {#- Columns added by an upgrade are NULL until the first run after it stores them. -#}
    {%- set resolved_rows -%}
        (select tenant_id, record_id, customer_key,
            {{ built_columns(identity_key_column_names(), 'text') }}
        from {{ this }}
        where {{ tenant_filter() }})
    {%- endset -%}
    create temporary table identity_changed_records as
    select
        coalesce(records.tenant_id, resolved.tenant_id) as tenant_id,
        coalesce(records.record_id, resolved.record_id) as record_id
    from (select * from {{ records }} where {{ tenant_filter() }}) as records
    full join {{ resolved_rows }} as resolved
        on records.tenant_id = resolved.tenant_id
        and records.record_id = resolved.record_id
    where records.record_id is null
        or resolved.record_id is null
        or ({{ identity_key_columns('records') }})
            is distinct from ({{ identity_key_columns('resolved') }});
    analyze identity_changed_records;

    create temporary table identity_touched_keys as
    with current_records as (
        select records.*
        from {{ records }} as records
        inner join identity_changed_records as changed
            on records.tenant_id = changed.tenant_id
            and records.record_id = changed.record_id
    ),

    resolved_records as (
        select resolved.*
        from {{ resolved_rows }} as resolved
        inner join identity_changed_records as changed
            on resolved.tenant_id = changed.tenant_id
            and resolved.record_id = changed.record_id
    )

    select tenant_id, identity_key from ({{ identity_keys('current_records', 'record_id') }}) as now
    union
    select tenant_id, identity_key from ({{ identity_keys('resolved_records', 'record_id') }}) as before;
    analyze identity_touched_keys;

    create temporary table identity_resolution_scope as
    with tenant_records as (
        select * from {{ records }} where {{ tenant_filter() }}
    ),

    holders as (
        select record_keys.tenant_id, record_keys.record_id
        from ({{ identity_keys('tenant_records', 'record_id') }}) as record_keys
        inner join identity_touched_keys as touched
            on record_keys.tenant_id = touched.tenant_id
            and record_keys.identity_key = touched.identity_key
        union
        select tenant_id, record_id from identity_changed_records
    ),

    touched_customers as (
        select distinct resolved.tenant_id, resolved.customer_key
        from {{ resolved_rows }} as resolved
        inner join holders
            on resolved.tenant_id = holders.tenant_id
            and resolved.record_id = holders.record_id
    )

    select holders.tenant_id, holders.record_id
    from holders
    union
    select resolved.tenant_id, resolved.record_id
    from {{ resolved_rows }} as resolved
    inner join touched_customers
        on resolved.tenant_id = touched_customers.tenant_id
        and resolved.customer_key = touched_customers.customer_key;
    analyze identity_resolution_scope;

    create temporary table identity_key_counts as
    with tenant_records as (
        select * from {{ records }} where {{ tenant_filter() }}
    ),

    record_keys as (
        {{ identity_keys('tenant_records', 'record_id') }}
    )

    select record_keys.tenant_id, record_keys.identity_key, count(*) as records
    from record_keys
    where (record_keys.tenant_id, record_keys.identity_key) in (
        select scope_keys.tenant_id, scope_keys.identity_key
        from record_keys as scope_keys
        inner join identity_resolution_scope as scope
            on scope_keys.tenant_id = scope.tenant_id
            and scope_keys.record_id = scope.record_id
    )
    group by record_keys.tenant_id, record_keys.identity_key;
    analyze identity_key_counts
    {%- endif -%}
{% endmacro %}
