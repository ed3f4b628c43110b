{#-
    The single definition of "this order is a purchase", used by stg_vtex__orders.is_purchase
    and nowhere else. Every VTEX status counts except those of an order that did not (or no
    longer) happen: canceled, cancel (canceling), cancellation-requested, request-cancel,
    replaced (superseded by a new order, which counts instead) and a missing/empty status,
    which is how VTEX serves an incomplete order. Open statuses (payment-pending, handling,
    ...) count: the order was placed; a later cancellation flips it on the next sync.
-#}
{% macro is_purchase_status(status_col) -%}
    coalesce(lower(trim({{ status_col }})), '') not in (
        '', 'canceled', 'cancel', 'cancellation-requested', 'request-cancel', 'replaced'
    )
{%- endmacro %}
