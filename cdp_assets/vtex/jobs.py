"""Jobs over the VTEX assets, as schedules, sensors and the UI launch them."""

import dagster as dg

from cdp_assets.lib.run_bounds import run_bound
from cdp_assets.partitions import tenant_months, tenants
from cdp_assets.vtex.assets import (
    vtex_customers,
    vtex_orders,
    vtex_orders_feed,
    vtex_products,
    vtex_skus,
)

TENANT_SYNC_JOB = "vtex_tenant_sync"
ORDERS_SYNC_JOB = "vtex_orders_sync"
FEED_SYNC_JOB = "vtex_orders_feed_sync"

vtex_tenant_sync = dg.define_asset_job(
    TENANT_SYNC_JOB,
    selection=[vtex_products, vtex_skus, vtex_customers],
    partitions_def=tenants,
    description="Catalog and Master Data customers of one tenant.",
    tags=run_bound(TENANT_SYNC_JOB),
)
vtex_orders_sync = dg.define_asset_job(
    ORDERS_SYNC_JOB,
    selection=[vtex_orders],
    partitions_def=tenant_months,
    description="Orders of one tenant and month, a range of its months, or the recent months of"
    " a block of neighbouring tenants.",
    tags=run_bound(ORDERS_SYNC_JOB),
)
vtex_orders_feed_sync = dg.define_asset_job(
    FEED_SYNC_JOB,
    selection=[vtex_orders_feed],
    description="Drain the VTEX orders feed of a tenant, or of a block of neighbouring tenants,"
    " into raw_vtex.orders.",
    tags=run_bound(FEED_SYNC_JOB),
)
