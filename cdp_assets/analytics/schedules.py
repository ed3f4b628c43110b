"""When audiences are rebuilt (the old facebook-automation cadence, every 48 hours at 10:00)
and the churn holdout checks the bands (weekly)."""

from datetime import date

import dagster as dg

from cdp_assets.analytics.jobs import audiences_refresh, churn_holdout_refresh
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.tenants.runs import block_request, tenant_blocks, tenants_with_partitions
from cdp_assets.vtex.schedules import TIMEZONE


def on_48_hour_cadence(day: date) -> bool:
    """Every other day, counted from a fixed origin. Cron cannot say "every 48 hours" (`*/2`
    restarts on the 1st, giving two days in a row after a 31st); day ordinals keep the
    rhythm across month and year ends."""
    return day.toordinal() % 2 == 0


@dg.schedule(
    job=audiences_refresh,
    cron_schedule="0 10 * * *",
    execution_timezone=TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
def audiences_every_48_hours(
    context: dg.ScheduleEvaluationContext,
) -> dg.RunRequest | dg.SkipReason:
    """Every other day at 10:00: a daily tick that skips the off days of the cadence."""
    day = context.scheduled_execution_time.date()
    if not on_48_hour_cadence(day):
        return dg.SkipReason(f"{day}: off day of the 48-hour cadence")
    return dg.RunRequest(run_key=f"audiences|{day:%Y%m%d}")


@dg.schedule(
    job=churn_holdout_refresh,
    # Sundays at 03:00, before the first syncs (05:00) start the daily refreshes.
    cron_schedule="0 3 * * 0",
    execution_timezone=TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
def churn_holdout_weekly(
    context: dg.ScheduleEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    """Every week, the churn holdout of every active tenant: one run per block of
    neighbouring tenants (one dbt build for all of them)."""
    tenant_rows, order = tenants_with_partitions(context, warehouse)
    day = context.scheduled_execution_time.date()
    requests = [
        block_request(block, f"{day:%Y%m%d}") for block in tenant_blocks(order, tenant_rows)
    ]
    return requests or dg.SkipReason("no active tenants")
