"""Which SKUs a product collection holds: the best sellers among one audience's members.

One rule, parameterized per collection in `cdp.destination_audiences.params`:
- ``audience``: whose purchases count (an audience materialized view);
- ``rank_by``: ``revenue`` (sum of line totals) or ``buyers`` (distinct customers);
- ``days``: purchases of the last N days; ``top_n``: how many SKUs.

The examples in docs/operator.md are this rule with different parameters: top 50 SKUs by revenue
among Champions in the last 90 days; products favoured by high-CLV customers (buyers, 365
days); win-back picks for at-risk customers (buyers among audience_rfm_at_risk).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from cdp_assets.tenants.registry import SLUG

RANKINGS = {
    "revenue": sql.SQL("sum(items.line_total)"),
    "buyers": sql.SQL("count(DISTINCT purchases.customer_key)"),
}
DEFAULTS: dict[str, Any] = {"rank_by": "revenue", "days": 90, "top_n": 50}
# Bounds: millions of days fail the query (a date before 4713 BC), and every SKU is one paced
# VTEX call (2 a second), so 10,000 already take an hour and a half.
LIMITS = {"days": 36_500, "top_n": 10_000}


def rule_params(params: dict[str, Any]) -> dict[str, Any]:
    """The rule's parameters with defaults, refused with a clear message when malformed."""
    if not isinstance(params, dict):  # a hand-edited params column may hold any JSON
        raise ValueError("collection rule: parameters must be a JSON object")
    merged = {**DEFAULTS, **params}
    unknown = set(merged) - {*DEFAULTS, "audience"}
    problems = [f"unknown parameters {sorted(unknown)}"] if unknown else []
    audience = merged.get("audience")
    if not isinstance(audience, str) or not SLUG.fullmatch(audience):
        problems.append("'audience' (the name of an audience materialized view) is required")
    if not isinstance(merged["rank_by"], str) or merged["rank_by"] not in RANKINGS:
        problems.append(f"'rank_by' must be one of {sorted(RANKINGS)}")
    for name, limit in LIMITS.items():
        value = merged[name]
        # bool is an int in Python: `true` must not pass for 1.
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            problems.append(f"{name!r} must be an integer from 1 to {limit}")
    if problems:
        raise ValueError("collection rule: " + "; ".join(problems))
    return merged


def collection_skus(
    conn: psycopg.Connection, tenant_id: str, params: dict[str, Any]
) -> list[tuple[str, str, list[str]]]:
    """(sku_id, sku_id, [sku_id]) for the SKUs the rule selects, best first (at most top_n):
    a member of a collection is its SKU id, nothing to hash."""
    rule = rule_params(params)
    query = sql.SQL(
        """
        WITH members AS (
            SELECT customer_key FROM audiences.{audience} WHERE tenant_id = %(tenant_id)s
        ),
        purchases AS (
            SELECT p.order_id, p.customer_key
            FROM intermediate.int_orders__purchases p
            JOIN members USING (customer_key)
            WHERE p.tenant_id = %(tenant_id)s AND p.is_purchase
              AND p.order_date >= current_date - %(days)s
        )
        SELECT items.sku_id
        FROM staging.stg_vtex__order_items items
        JOIN purchases USING (order_id)
        WHERE items.tenant_id = %(tenant_id)s AND items.sku_id ~ '^[0-9]+$'
        GROUP BY items.sku_id
        ORDER BY {ranking} DESC, items.sku_id
        LIMIT %(top_n)s
        """
    ).format(audience=sql.Identifier(rule["audience"]), ranking=RANKINGS[rule["rank_by"]])
    rows = conn.execute(query, {"tenant_id": tenant_id, **rule}).fetchall()
    return [(sku_id, sku_id, [sku_id]) for (sku_id,) in rows]
