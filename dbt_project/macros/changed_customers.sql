{#-
    Pre-hook (inside the model's transaction) of the per-customer tables whose cost follows the
    change: the purchase summary and `customers`. A day's orders change about 1 % of a tenant's
    customers; rewriting every customer's row on each refresh made the increment's cost follow
    the history instead.

    On an incremental run it fills the temporary table `changed_customers` with what this run
    rebuilds, per tenant of the run, and deletes those rows of the table (macro
    in_changed_customers filters the model's inputs to them):
    - the whole tenant (a row with customer_key NULL) when the table holds none of its rows or
      holds them as of another day than this run's: as_of moves every customer's ages and
      recency, so the first refresh of a day rewrites the tenant, the later ones do not;
    - otherwise, the customers of the purchases rebuilt since the tenant's rows were last built
      (built_at), and the customers those orders belonged to before (replaced_customer_key: a
      merge leaves the merged-away customer without purchases, so its row goes), the customers
      of the `changed_profiles` relation's rows built since (contact data), and the tenant's
      suppressed customers (a privacy request drops their rows at once, whatever changed).
    The rows a run writes all carry its built_at and this run's as_of; every row of a tenant is
    as of one day.
-#}
{% macro changed_customers_scope(changed_profiles=none) %}
    {%- if is_incremental() -%}
    {%- set purchases = ref('int_orders__purchases') -%}
    drop table if exists changed_customers;
    create temporary table changed_customers as
    with built as (
        select
            tenants.tenant_id,
            (select max(built_at) from {{ this }} as built where built.tenant_id = tenants.tenant_id)
                as built_at,
            (select as_of from {{ this }} as built where built.tenant_id = tenants.tenant_id limit 1)
                as as_of
        from {{ ref('stg_cdp__tenants') }} as tenants
        where {{ tenant_filter('tenants.tenant_id') }}
    ),

    kept_tenants as (
        select tenant_id, built_at from built
        where built_at is not null and as_of = {{ as_of_date() }}
    ),

    rebuilt_purchases as (
        select purchases.tenant_id, purchases.customer_key, purchases.replaced_customer_key
        from {{ purchases }} as purchases
        inner join kept_tenants on purchases.tenant_id = kept_tenants.tenant_id
        where purchases.built_at > kept_tenants.built_at
    ),

    suppressions as (
        select tenant_id, identifier_sha256 from {{ source('cdp', 'privacy_suppressions') }}
        where tenant_id in (select tenant_id from kept_tenants)
    )

    select tenant_id, null::text as customer_key
    from built
    where tenant_id not in (select tenant_id from kept_tenants)
    union
    select tenant_id, customer_key from rebuilt_purchases
    union
    select tenant_id, replaced_customer_key from rebuilt_purchases
    where replaced_customer_key is not null
    {%- if changed_profiles is not none %}
    union
    select profiles.tenant_id, profiles.customer_key
    from {{ changed_profiles }} as profiles
    inner join kept_tenants on profiles.tenant_id = kept_tenants.tenant_id
    where profiles.built_at > kept_tenants.built_at
    {%- endif %}
    union
    select tenant_id, customer_key from ({{ suppressed_customers('suppressions') }}) as suppressed;
    analyze changed_customers;

    delete from {{ this }} as built
    where built.tenant_id in (select tenant_id from changed_customers where customer_key is null)
        or (built.tenant_id, built.customer_key)
            in (select tenant_id, customer_key from changed_customers);
    {%- endif -%}
{% endmacro %}


{#- The rows of `relation` (an alias with tenant_id and customer_key) this run rebuilds: every
    row on a full build, those in changed_customers on an incremental one. -#}
{% macro in_changed_customers(relation) -%}
    {%- if is_incremental() -%}
    ({{ relation }}.tenant_id in (select tenant_id from changed_customers where customer_key is null)
        or ({{ relation }}.tenant_id, {{ relation }}.customer_key)
            in (select tenant_id, customer_key from changed_customers))
    {%- else -%}
    true
    {%- endif -%}
{%- endmacro %}


{#- The customers whose identity records carry an identifier of `suppressions` (a relation of
    tenant_id, identifier_sha256: cdp.privacy_suppressions rows). Each record's keys are hashed
    once, and only in a tenant that has suppressions. -#}
{% macro suppressed_customers(suppressions) %}
    select distinct record_keys.tenant_id, record_keys.customer_key
    from {{ ref('int_identity__customer_keys') }} as record_keys
    cross join lateral (
        values (record_keys.email_normalized), (record_keys.phone_e164),
            (record_keys.document_normalized)
    ) as identifiers (identifier)
    where {{ tenant_filter('record_keys.tenant_id') }}
        and record_keys.tenant_id in (select tenant_id from {{ suppressions }})
        and (record_keys.tenant_id, {{ sha256_hex('identifiers.identifier') }})
            in (select tenant_id, identifier_sha256 from {{ suppressions }})
{% endmacro %}
