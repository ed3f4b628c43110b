"""Checks on the landed VTEX documents: every tenant has rows, and staging reads all of them."""

import dagster as dg

from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.vtex.assets import vtex_customers, vtex_orders, vtex_products, vtex_skus

RAW_TABLES = {
    vtex_orders: "orders",
    vtex_products: "products",
    vtex_skus: "skus",
    vtex_customers: "customers",
}

EMPTY_TENANTS_SQL = """
SELECT t.tenant_id FROM cdp.tenants t
WHERE t.active AND EXISTS (SELECT 1 FROM cdp.sync_state s
                           WHERE s.tenant_id = t.tenant_id AND s.entity = %(entity)s)
  AND NOT EXISTS (SELECT 1 FROM raw_vtex.{table} r WHERE r.tenant_id = t.tenant_id)
ORDER BY 1
"""


def _rows_check(asset: dg.AssetsDefinition, table: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=asset,
        name=f"{table}_landed_for_every_synced_tenant",
        description=f"Every active tenant that completed a {table} sync has rows in"
        f" raw_vtex.{table}.",
    )
    def check(warehouse: WarehouseResource) -> dg.AssetCheckResult:
        with warehouse.connect() as conn:
            empty = [
                tenant
                for (tenant,) in conn.execute(
                    EMPTY_TENANTS_SQL.format(table=table), {"entity": table}
                )
            ]
        return dg.AssetCheckResult(
            passed=not empty, metadata={"tenants_without_rows": ", ".join(empty) or "none"}
        )

    return check


STAGING_SQL = """
SELECT tenant_id, raw.count, coalesce(staged.count, 0)
FROM (SELECT tenant_id, count(*) FROM raw_vtex.orders GROUP BY 1) raw
LEFT JOIN (SELECT tenant_id, count(*) FROM staging.stg_vtex__orders GROUP BY 1) staged
    USING (tenant_id)
WHERE raw.count <> coalesce(staged.count, 0)
"""


@dg.asset_check(
    asset=vtex_orders,
    description="staging.stg_vtex__orders has exactly the raw orders of every tenant (staging"
    " renames and casts, it must not drop or duplicate).",
)
def orders_raw_match_staging(warehouse: WarehouseResource) -> dg.AssetCheckResult:
    with warehouse.connect() as conn:
        exists = conn.execute("SELECT to_regclass('staging.stg_vtex__orders')").fetchone()
        if exists == (None,):
            return dg.AssetCheckResult(
                passed=True, metadata={"note": "staging not built yet: nothing to compare"}
            )
        mismatches = conn.execute(STAGING_SQL).fetchall()
    return dg.AssetCheckResult(
        passed=not mismatches,
        metadata={
            "tenants_mismatched": len(mismatches),
            "details": ", ".join(f"{t}: raw {r} vs staged {s}" for t, r, s in mismatches) or "none",
        },
    )


raw_rows_checks = [_rows_check(asset, table) for asset, table in RAW_TABLES.items()]
