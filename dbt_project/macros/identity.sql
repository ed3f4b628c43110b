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
