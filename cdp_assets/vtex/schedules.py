"""When VTEX data is synced: the old daily-sync and product-sync workers as schedules.

Times are in Buenos Aires. Every tick requests one run per active tenant, in priority
order (lower syncs first), the order the run queue launches them in (tenants/runs.py).
"""

from collections.abc import Mapping
from datetime import datetime

import dagster as dg

from cdp_assets.lib.sync_state import OrderGaps, order_gaps
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import TENANT_RUN_TAG, TIMEZONE, order_months, tenant_month_range_tags
from cdp_assets.tenants.registry import Tenant
from cdp_assets.tenants.runs import tenants_with_partitions
from cdp_assets.vtex.assets import OVERLAP
from cdp_assets.vtex.jobs import vtex_orders_sync, vtex_tenant_sync


def recent_months(moment: datetime) -> list[str]:
    """The month partitions a sync of the last 48 hours touches (two across a month end)."""
    keys = {
        order_months.get_partition_key_for_timestamp(m.timestamp())
        for m in (moment - OVERLAP, moment)
    }
    return sorted(keys)


# Older months left with unread orders, or not reconciled with VTEX's totals, are read again
# by the schedule, a few per tenant and tick (newest first), so a tenant does not stay
# degraded until someone re-runs the month.
REPAIR_MONTHS_PER_TICK = 3
REPAIR_TAG = "cdp/repair"


def order_sync_requests(
    tenant_rows: list[Tenant],
    moment: datetime,
    gaps: Mapping[str, OrderGaps] | None = None,
) -> list[dg.RunRequest]:
    """One run per tenant (priority order) over the months of the 48 hours before `moment`:
    across a month end, one run covers both months (a range of the tenant's partitions).
    Then, from `gaps`, a run per older month to read again (REPAIR_MONTHS_PER_TICK at most
    per tenant)."""
    months = recent_months(moment)
    requests = []
    for tenant in tenant_rows:
        tags = {TENANT_RUN_TAG: tenant.tenant_id}
        partition_key = None
        if len(months) == 1:
            partition_key = dg.MultiPartitionKey({"tenant": tenant.tenant_id, "month": months[0]})
        else:
            tags |= tenant_month_range_tags(tenant.tenant_id, months[0], months[-1])
        requests.append(
            dg.RunRequest(
                run_key=f"{tenant.tenant_id}|{moment:%Y%m%d%H%M}",
                partition_key=partition_key,
                tags=tags,
            )
        )
    for tenant in tenant_rows:
        found = (gaps or {}).get(tenant.tenant_id)
        if found is None:
            continue
        older = {m.isoformat() for m in (*found.unread, *found.unsettled)} - set(months)
        for month in sorted(older, reverse=True)[:REPAIR_MONTHS_PER_TICK]:
            requests.append(
                dg.RunRequest(
                    run_key=f"{tenant.tenant_id}|{month}|{moment:%Y%m%d%H%M}",
                    partition_key=dg.MultiPartitionKey(
                        {"tenant": tenant.tenant_id, "month": month}
                    ),
                    tags={REPAIR_TAG: "true", TENANT_RUN_TAG: tenant.tenant_id},
                )
            )
    return requests


def tenant_run_requests(tenant_rows: list[Tenant], moment: datetime) -> list[dg.RunRequest]:
    """One run per tenant and day, in priority order."""
    return [
        dg.RunRequest(
            run_key=f"{tenant.tenant_id}|{moment:%Y%m%d}",
            partition_key=tenant.tenant_id,
        )
        for tenant in tenant_rows
    ]


@dg.schedule(
    job=vtex_orders_sync,
    cron_schedule="0 6,18 * * *",
    execution_timezone=TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Orders of the last 48 hours of every active tenant, at 06:00 and 18:00"
    " (Buenos Aires): one run per tenant, in priority order, over the months those 48 hours"
    " touch (two across a month end); then up to 3 older months per tenant that were left"
    " with unread orders or unreconciled with VTEX's totals, read again.",
)
def vtex_orders_twice_daily(
    context: dg.ScheduleEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    tenant_rows = tenants_with_partitions(context, warehouse)[0]
    with warehouse.connect() as conn:
        gaps = order_gaps(conn, [t.tenant_id for t in tenant_rows])
    requests = order_sync_requests(tenant_rows, context.scheduled_execution_time, gaps)
    return requests or dg.SkipReason("no active tenants")


@dg.schedule(
    job=vtex_tenant_sync,
    cron_schedule="0 5 * * *",
    execution_timezone=TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Products, SKUs and Master Data customers of every active tenant, at 05:00"
    " (Buenos Aires): one run per tenant, in priority order.",
)
def vtex_catalog_daily(
    context: dg.ScheduleEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    requests = tenant_run_requests(
        tenants_with_partitions(context, warehouse)[0], context.scheduled_execution_time
    )
    return requests or dg.SkipReason("no active tenants")
