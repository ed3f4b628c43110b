"""When audiences are rebuilt: the old facebook-automation cadence, every 48 hours at 10:00."""

from datetime import date

import dagster as dg

from cdp_assets.analytics.jobs import audiences_refresh
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
