"""When VTEX data is synced: the old daily-sync and product-sync workers as schedules.

Times are in Buenos Aires. Every tick requests runs for the active tenants in priority order
(lower syncs first), the order the run queue launches them in (tenants/runs.py): the catalog
one run per tenant, the orders' 48 hours one run per block of neighbouring tenants.
"""

from collections.abc import Mapping, Sequence
from datetime import datetime

import dagster as dg

from cdp_assets.lib.sync_state import OrderGaps, order_gaps
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    TENANT_RUN_TAG,
    TIMEZONE,
    order_months,
    tenant_month_key,
    tenant_month_range_tags,
)
from cdp_assets.tenants.registry import Tenant
from cdp_assets.tenants.runs import tenant_blocks, tenants_with_partitions
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


# Tenants per run of the 48-hour sync. A run over many tenants pays one run's start instead of
# one per tenant, but its tenants share one process: larger blocks are split, so that several
# runs share the work (the List sync of 41 tenants took 18 s in one run, 10 s in runs of 10).
ORDER_SYNC_TENANTS_PER_RUN = 10


def order_sync_requests(
    tenant_rows: list[Tenant],
    partition_order: Sequence[str],
    moment: datetime,
    gaps: Mapping[str, OrderGaps] | None = None,
) -> list[dg.RunRequest]:
    """One run per block of neighbouring tenants (tenant_blocks, of ORDER_SYNC_TENANTS_PER_RUN
    at most; the most urgent first) over the months of the 48 hours before `moment` (two
    across a month end): a run's start costs more than most tenants' 48 hours. Then, from
    `gaps`, a run per older month to read again (REPAIR_MONTHS_PER_TICK at most per tenant)."""
    months = recent_months(moment)
    requests = []
    for block in tenant_blocks(partition_order, tenant_rows, ORDER_SYNC_TENANTS_PER_RUN):
        first, last = block[0].tenant_id, block[-1].tenant_id
        partition_key = None
        tags: dict[str, str]
        if first != last:
            tags = {
                RANGE_START_TAG: tenant_month_key(first, months[0]),
                RANGE_END_TAG: tenant_month_key(last, months[-1]),
            }
        elif len(months) == 1:
            partition_key = tenant_month_key(first, months[0])
            tags = {TENANT_RUN_TAG: first}
        else:
            tags = tenant_month_range_tags(first, months[0], months[-1])
        block_key = first if first == last else f"{first}..{last}"
        requests.append(
            dg.RunRequest(
                run_key=f"{block_key}|{moment:%Y%m%d%H%M}",
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
                    partition_key=tenant_month_key(tenant.tenant_id, month),
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
    " (Buenos Aires): one run per block of up to 10 neighbouring tenants (4 at once within"
    " it), over the months those 48 hours touch (two across a month end); then up to 3 older"
    " months per tenant that were left with unread orders or unreconciled with VTEX's totals,"
    " read again.",
)
def vtex_orders_twice_daily(
    context: dg.ScheduleEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    tenant_rows, partition_order = tenants_with_partitions(context, warehouse)
    with warehouse.connect() as conn:
        gaps = order_gaps(conn, [t.tenant_id for t in tenant_rows])
    requests = order_sync_requests(
        tenant_rows, partition_order, context.scheduled_execution_time, gaps
    )
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
