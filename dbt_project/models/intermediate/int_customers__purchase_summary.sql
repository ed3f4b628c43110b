{{
    config(
        materialized='incremental',
        incremental_strategy='delete+insert',
        unique_key='tenant_id',
        pre_hook="{{ delete_tenant_rows() }}",
    )
}}

-- The purchase summary as of var as_of (macros/purchase_summary.sql).
{{ purchase_summary(as_of_date()) }}
