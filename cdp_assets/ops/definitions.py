import dagster as dg

from cdp_assets.ops.assets import operations_metrics
from cdp_assets.ops.jobs import maintenance_job, operations_metrics_job
from cdp_assets.ops.resources import OpsMetricsResource
from cdp_assets.ops.schedules import maintenance_schedule, operations_metrics_schedule
from cdp_assets.ops.sensors import sync_errors_sensor


def defs() -> dg.Definitions:
    return dg.Definitions(
        assets=[operations_metrics],
        jobs=[operations_metrics_job, maintenance_job],
        schedules=[operations_metrics_schedule, maintenance_schedule],
        sensors=[sync_errors_sensor],
        resources={"ops_metrics": OpsMetricsResource()},
    )
