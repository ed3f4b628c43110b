"""Jobs over the VTEX assets, as schedules, sensors and the UI launch them."""

import dagster as dg

from cdp_assets.lib.run_bounds import run_bound
from cdp_assets.partitions import tenant_months, tenants
from cdp_assets.vtex.assets import vtex_customers, vtex_orders, vtex_products, vtex_skus

TENANT_SYNC_JOB = "vtex_tenant_sync"
ORDERS_SYNC_JOB = "vtex_orders_sync"

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
    description="Orders of one tenant and month (or a range of months).",
    tags=run_bound(ORDERS_SYNC_JOB),
)
