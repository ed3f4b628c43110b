{#-
    RFM scoring and segments (docs: /work/shared/reference/analytics.md §1.3 and §5).
-#}

{#-
    A 1-5 quintile score per tenant from percent_rank(): customers with equal values share a
    score, so the result is deterministic without a tie-breaker. ntile() would split ties
    at random across buckets. Buckets can be uneven and a score can be skipped when many
    customers tie (e.g. one-order customers), which is the price of determinism.
    percent_rank() = 1 for the top customer: least(5, ...) keeps it at 5.
-#}
{% macro rfm_score(order_by) -%}
    least(5, 1 + floor(5 * percent_rank() over (partition by tenant_id order by {{ order_by }})))::integer
{%- endmacro %}


{#-
    The project's 5x5 (r_score, fm_score) table, in exactly the CASE order of analytics.md
    §1.3; total and non-overlapping, all 11 segments reachable:

      r\fm  1               2                   3                   4                5
      5     New Customers   Potential Loyalist  Potential Loyalist  Champions        Champions
      4     Promising       Potential Loyalist  Potential Loyalist  Loyal Customers  Loyal Customers
      3     About To Sleep  About To Sleep      Need Attention      Loyal Customers  Loyal Customers
      2     Hibernating     Hibernating         At Risk             At Risk          Can't Lose Them
      1     Lost            Lost                At Risk             At Risk          Can't Lose Them
-#}
{% macro rfm_segment(r, fm) -%}
    case
        when {{ r }} = 5 and {{ fm }} = 1 then 'New Customers'
        when {{ r }} = 5 and {{ fm }} in (2, 3) then 'Potential Loyalist'
        when {{ r }} = 5 then 'Champions'
        when {{ r }} = 4 and {{ fm }} = 1 then 'Promising'
        when {{ r }} = 4 and {{ fm }} in (2, 3) then 'Potential Loyalist'
        when {{ r }} = 4 then 'Loyal Customers'
        when {{ r }} = 3 and {{ fm }} <= 2 then 'About To Sleep'
        when {{ r }} = 3 and {{ fm }} = 3 then 'Need Attention'
        when {{ r }} = 3 then 'Loyal Customers'
        when {{ fm }} = 5 then 'Can''t Lose Them'
        when {{ fm }} >= 3 then 'At Risk'
        when {{ r }} = 2 then 'Hibernating'
        else 'Lost'
    end
{%- endmacro %}
