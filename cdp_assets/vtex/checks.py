"""Checks on the landed VTEX documents: a tenant that completed a sync has rows, and its order
months hold every order VTEX reported, none left unread. (That staging keeps every order is a
dbt test, `assert_staged_orders_match_raw`, run when staging is built.)

Each check is partitioned like its asset and judges only the tenants of its run, so one
tenant's empty sync is that tenant's red check and leaves every other tenant's green.
"""

from collections.abc import Sequence
from datetime import date

import dagster as dg

from cdp_assets.lib.sync_state import order_gaps
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import tenant_months, tenant_of_partition_key
from cdp_assets.vtex.assets import vtex_customers, vtex_orders, vtex_products, vtex_skus

RAW_TABLES = {
    vtex_orders: "orders",
    vtex_products: "products",
    vtex_skus: "skus",
    vtex_customers: "customers",
}

EMPTY_TENANTS_SQL = """
SELECT t.tenant_id FROM cdp.tenants t
WHERE t.tenant_id = ANY(%(tenants)s)
  AND EXISTS (SELECT 1 FROM cdp.sync_state s
              WHERE s.tenant_id = t.tenant_id AND s.entity = %(entity)s)
  AND NOT EXISTS (SELECT 1 FROM raw_vtex.{table} r WHERE r.tenant_id = t.tenant_id)
ORDER BY 1
"""


def tenants_of(partition_keys: Sequence[str]) -> list[str]:
    """The tenants of a run's partitions (`acme`, or `2025-01-01|acme` for order months)."""
    return sorted({t for key in partition_keys if (t := tenant_of_partition_key(key))})


def _rows_check(asset: dg.AssetsDefinition, table: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=asset,
        name=f"{table}_landed_for_every_synced_tenant",
        partitions_def=asset.partitions_def,
        description=f"The tenant has rows in raw_vtex.{table} once it completed a {table} sync.",
    )
    def check(
        context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource
    ) -> dg.AssetCheckResult:
        tenants = tenants_of(context.partition_keys)
        with warehouse.connect() as conn:
            empty = [
                tenant
                for (tenant,) in conn.execute(
                    EMPTY_TENANTS_SQL.format(table=table), {"entity": table, "tenants": tenants}
                )
            ]
        return dg.AssetCheckResult(
            passed=not empty,
            metadata={
                "tenants_checked": ", ".join(tenants),
                "tenants_without_rows": ", ".join(empty) or "none",
            },
        )

    return check


@dg.asset_check(
    asset=vtex_orders,
    name="orders_read_and_reconciled",
    partitions_def=tenant_months,
    description="The tenant's order month holds every order VTEX reported for it: no order"
    " left unread (raw_vtex.unreadable_orders), the month not unreconciled with List orders'"
    " count nor failed (cdp.order_months).",
)
def orders_reconciled_check(
    context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource
) -> dg.AssetCheckResult:
    tenants = tenants_of(context.partition_keys)
    months = sorted(
        {
            date.fromisoformat(
                tenant_months.get_partition_key_from_str(key).keys_by_dimension["month"]
            )
            for key in context.partition_keys
        }
    )
    with warehouse.connect() as conn:
        gaps = order_gaps(conn, tenants, months)
    degraded = {tenant: found for tenant, found in gaps.items() if found.degraded}
    return dg.AssetCheckResult(
        passed=not degraded,
        metadata={
            "tenants_checked": ", ".join(tenants),
            "orders_unread": sum(sum(found.unread.values()) for found in gaps.values()),
            "months_unsettled": sum(len(found.unsettled) for found in gaps.values()),
            "gaps": "; ".join(f"{t}: {found.describe()}" for t, found in degraded.items())
            or "none",
        },
    )


raw_rows_checks = [
    *(_rows_check(asset, table) for asset, table in RAW_TABLES.items()),
    orders_reconciled_check,
]
