"""When the operations jobs run: the metrics every 15 minutes, the maintenance every night."""

import dagster as dg

from cdp_assets.ops.jobs import maintenance_job, operations_metrics_job
from cdp_assets.ops.metrics import THRESHOLDS_ENV
from cdp_assets.partitions import TIMEZONE

# Running by default: the metrics only read, and a stopped schedule would leave the plots and
# the alerts silent.
operations_metrics_schedule = dg.ScheduleDefinition(
    name="operations_metrics_every_15_minutes",
    job=operations_metrics_job,
    cron_schedule="*/15 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description=f"Operations metrics and their checks (thresholds: ${THRESHOLDS_ENV}).",
)

# At night in the stores' time zone, away from the 06:00 and 18:00 order syncs.
maintenance_schedule = dg.ScheduleDefinition(
    job=maintenance_job,
    cron_schedule="30 3 * * *",
    execution_timezone=TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every night at 03:30: deletes the records past their retention (rejects,"
    " unreadable orders, activation history, sync errors, metric states, Dagster runs that"
    " materialized nothing) and refreshes the planner's statistics of the big tables.",
)
