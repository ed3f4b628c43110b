import dagster as dg

from cdp_assets.ops.maintenance import maintenance_job, maintenance_schedule
from cdp_assets.ops.metrics_defs import (
    OpsMetricsResource,
    operations_metrics,
    operations_metrics_job,
    operations_metrics_schedule,
)
from cdp_assets.ops.sensors import sync_errors_sensor


def defs() -> dg.Definitions:
    return dg.Definitions(
        assets=[operations_metrics],
        jobs=[operations_metrics_job, maintenance_job],
        schedules=[operations_metrics_schedule, maintenance_schedule],
        sensors=[sync_errors_sensor],
        resources={"ops_metrics": OpsMetricsResource()},
    )
