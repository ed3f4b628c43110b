"""When every tenant's audiences are rebuilt (the old facebook-automation cadence, every 48
hours at 10:00: the safety net under the automation, which refreshes a tenant's audiences
minutes after its marts change) and the churn holdout checks the bands (weekly)."""

from datetime import date

import dagster as dg

from cdp_assets.analytics.jobs import all_tenants_tags, audiences_refresh, churn_holdout_refresh
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import TIMEZONE
from cdp_assets.tenants.runs import block_request, tenant_blocks, tenants_with_partitions


def on_48_hour_cadence(day: date) -> bool:
    """Every other day, counted from a fixed origin: see FORTY_EIGHT_HOUR_CADENCE."""
    return day.toordinal() % 2 == 0


# Why the schedules of every 48 hours tick daily, for their descriptions in the UI.
FORTY_EIGHT_HOUR_CADENCE = (
    "Cron cannot say every 48 hours (`*/2` in the day field restarts on the 1st, which gives"
    " two days in a row after a 31st), so the schedule ticks every day at 10:00 and skips the"
    " days whose ordinal (days counted from 0001-01-01) is odd: the rhythm holds across month"
    " and year ends."
)


@dg.schedule(
    job=audiences_refresh,
    cron_schedule="0 10 * * *",
    execution_timezone=TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every tenant's audiences rebuilt every 48 hours, at 10:00 (Buenos Aires), in one"
    " run: the safety net under the automation, which refreshes a tenant's audiences as soon"
    f" as its marts change. {FORTY_EIGHT_HOUR_CADENCE}",
)
def audiences_every_48_hours(
    context: dg.ScheduleEvaluationContext,
) -> dg.RunRequest | dg.SkipReason:
    day = context.scheduled_execution_time.date()
    if not on_48_hour_cadence(day):
        return dg.SkipReason(f"{day}: off day of the 48-hour cadence")
    try:
        tags = all_tenants_tags(context.instance)
    except LookupError as no_tenants:
        return dg.SkipReason(str(no_tenants))
    return dg.RunRequest(run_key=f"audiences|{day:%Y%m%d}", tags=tags)


@dg.schedule(
    job=churn_holdout_refresh,
    # Sundays at 03:00, before the first syncs (05:00) start the daily refreshes.
    cron_schedule="0 3 * * 0",
    execution_timezone=TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Sundays at 03:00 (Buenos Aires), before the day's syncs: the churn holdout of"
    " every active tenant (the bands as of the calibration date against who bought again"
    " since), one run per block of neighbouring tenants, one dbt build for all of them.",
)
def churn_holdout_weekly(
    context: dg.ScheduleEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    tenant_rows, order = tenants_with_partitions(context, warehouse)
    day = context.scheduled_execution_time.date()
    requests = [
        block_request(block, f"{day:%Y%m%d}") for block in tenant_blocks(order, tenant_rows)
    ]
    return requests or dg.SkipReason("no active tenants")
