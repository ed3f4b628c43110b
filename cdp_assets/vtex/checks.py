"""Checks on the landed VTEX documents: every tenant has rows. (That staging keeps every
order is a dbt test, `assert_staged_orders_match_raw`, run when staging is built.)"""

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


raw_rows_checks = [_rows_check(asset, table) for asset, table in RAW_TABLES.items()]
