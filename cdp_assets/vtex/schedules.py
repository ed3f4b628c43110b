"""When VTEX data is synced: the old daily-sync and product-sync workers as schedules.

Times are in Buenos Aires. Every tick requests one run per active tenant, in priority
order and with a Dagster run priority derived from the tenant's (lower syncs first).
"""

from datetime import datetime

import dagster as dg

from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import order_months, tenants
from cdp_assets.tenants.registry import Tenant, list_tenants
from cdp_assets.vtex.assets import OVERLAP
from cdp_assets.vtex.jobs import vtex_orders_sync, vtex_tenant_sync

TIMEZONE = "America/Argentina/Buenos_Aires"


def run_priority(tenant: Tenant) -> dict[str, str]:
    # The queued run coordinator launches higher `dagster/priority` first.
    return {"dagster/priority": str(-tenant.priority)}


def active_tenants(context: dg.ScheduleEvaluationContext, warehouse: WarehouseResource) -> list:
    """Active tenants that already have a partition (the sensor adds new ones first)."""
    partitions = set(context.instance.get_dynamic_partitions(tenants.name))
    with warehouse.connect() as conn:
        return [t for t in list_tenants(conn, active_only=True) if t.tenant_id in partitions]


def recent_months(moment: datetime) -> list[str]:
    """The month partitions a sync of the last 48 hours touches (two across a month end)."""
    keys = {
        order_months.get_partition_key_for_timestamp(m.timestamp())
        for m in (moment - OVERLAP, moment)
    }
    return sorted(keys)


@dg.schedule(
    job=vtex_orders_sync,
    cron_schedule="0 6,18 * * *",
    execution_timezone=TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
def vtex_orders_twice_daily(
    context: dg.ScheduleEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    """Orders of the last 48 hours for every active tenant, at 06:00 and 18:00."""
    moment = context.scheduled_execution_time
    requests = [
        dg.RunRequest(
            run_key=f"{tenant.tenant_id}|{month}|{moment:%Y%m%d%H%M}",
            partition_key=dg.MultiPartitionKey({"tenant": tenant.tenant_id, "month": month}),
            tags=run_priority(tenant),
        )
        for tenant in active_tenants(context, warehouse)
        for month in recent_months(moment)
    ]
    return requests or dg.SkipReason("no active tenants")


@dg.schedule(
    job=vtex_tenant_sync,
    cron_schedule="0 5 * * *",
    execution_timezone=TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
def vtex_catalog_daily(
    context: dg.ScheduleEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    """Products, SKUs and Master Data customers of every active tenant, at 05:00."""
    day = context.scheduled_execution_time
    requests = [
        dg.RunRequest(
            run_key=f"{tenant.tenant_id}|{day:%Y%m%d}",
            partition_key=tenant.tenant_id,
            tags=run_priority(tenant),
        )
        for tenant in active_tenants(context, warehouse)
    ]
    return requests or dg.SkipReason("no active tenants")
