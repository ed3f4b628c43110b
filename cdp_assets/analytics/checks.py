"""Checks on what analytics hands to activation, beyond the dbt tests (which are checks too)."""

import dagster as dg

from cdp_assets.lib.warehouse import WarehouseResource

# An RFM segment holding more than this share of a tenant's customers means the scores
# collapsed (e.g. every customer tied): audiences built on it would be meaningless.
MAX_SEGMENT_SHARE = 0.6

BOUNDS_SQL = """
WITH customers AS (
    SELECT tenant_id, count(*) AS customers FROM marts.customers GROUP BY 1
)
SELECT catalog.tenant_id, catalog.audience, catalog.members, coalesce(customers.customers, 0)
FROM audiences.audience_catalog catalog
LEFT JOIN customers USING (tenant_id)
WHERE catalog.members > coalesce(customers.customers, 0)
   OR (catalog.audience LIKE 'audience_rfm_%%'
       AND catalog.members > %(share)s * greatest(customers.customers, 1))
ORDER BY 1, 2
"""


@dg.asset_check(
    asset=dg.AssetKey("audience_catalog"),
    description="Every audience holds at most its tenant's customers, and no RFM segment "
    f"audience more than {MAX_SEGMENT_SHARE:.0%} of them.",
)
def audience_sizes_within_bounds(warehouse: WarehouseResource) -> dg.AssetCheckResult:
    with warehouse.connect() as conn:
        offenders = conn.execute(BOUNDS_SQL, {"share": MAX_SEGMENT_SHARE}).fetchall()
        row = conn.execute("SELECT count(*) FROM audiences.audience_catalog").fetchone()
    assert row is not None
    (audiences,) = row
    return dg.AssetCheckResult(
        passed=not offenders,
        metadata={
            "audiences_checked": audiences,
            "out_of_bounds": len(offenders),
            "examples": dg.MetadataValue.md(
                "\n".join(f"- {t} {a}: {m} of {c} customers" for t, a, m, c in offenders[:20])
                or "none"
            ),
        },
    )
