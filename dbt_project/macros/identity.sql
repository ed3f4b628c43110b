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
