import dagster as dg

from cdp_assets.vtex.assets import (
    vtex_customers,
    vtex_orders,
    vtex_orders_feed,
    vtex_products,
    vtex_skus,
)
from cdp_assets.vtex.checks import raw_rows_checks
from cdp_assets.vtex.jobs import vtex_orders_feed_sync, vtex_orders_sync, vtex_tenant_sync
from cdp_assets.vtex.resources import VtexResource
from cdp_assets.vtex.schedules import vtex_catalog_daily, vtex_orders_twice_daily
from cdp_assets.vtex.sensors import vtex_orders_feed_sensor


def defs() -> dg.Definitions:
    return dg.Definitions(
        assets=[
            vtex_orders,
            vtex_products,
            vtex_skus,
            vtex_customers,
            vtex_orders_feed,
        ],
        asset_checks=raw_rows_checks,
        jobs=[vtex_tenant_sync, vtex_orders_sync, vtex_orders_feed_sync],
        schedules=[vtex_orders_twice_daily, vtex_catalog_daily],
        sensors=[vtex_orders_feed_sensor],
        resources={"vtex": VtexResource()},
    )
