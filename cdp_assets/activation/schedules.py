"""When every active destination is pushed regardless of changes: every 48 hours."""

from __future__ import annotations

from collections import defaultdict

import dagster as dg

from cdp_assets.activation.jobs import activation_push
from cdp_assets.activation.push_requests import cadence_requests
from cdp_assets.analytics.schedules import FORTY_EIGHT_HOUR_CADENCE
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import TIMEZONE
from cdp_assets.tenants.runs import tenants_with_partitions


@dg.schedule(
    job=activation_push,
    cron_schedule="0 10 * * *",
    execution_timezone=TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every active destination of every active tenant pushed every 48 hours, at"
    " 10:00 (Buenos Aires): one run per destination asset and block of neighbouring tenants."
    f" {FORTY_EIGHT_HOUR_CADENCE}",
)
def activation_every_48_hours(
    context: dg.ScheduleEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    platforms_of: dict[str, set[str]] = defaultdict(set)
    with warehouse.connect() as conn:
        for tenant_id, platform in conn.execute(
            "SELECT DISTINCT tenant_id, platform FROM cdp.destinations WHERE active"
        ):
            platforms_of[tenant_id].add(platform)
    requests = cadence_requests(
        *tenants_with_partitions(context, warehouse),
        platforms_of,
        context.scheduled_execution_time,
    )
    return requests or dg.SkipReason("off day of the 48-hour cadence, or no destinations")
