"""The operations jobs: the metrics and their checks, and the nightly maintenance."""

import dagster as dg

from cdp_assets.lib.run_bounds import HOUR, MAX_RUNTIME_TAG, run_bound
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.ops.assets import operations_metrics
from cdp_assets.ops.maintenance import run_maintenance

MAINTENANCE_JOB = "maintenance_job"

operations_metrics_job = dg.define_asset_job(
    "operations_metrics_job",
    selection=[operations_metrics],
    description="Materialize the operations metrics and run their checks.",
    tags=run_bound("operations_metrics_job"),
)


@dg.op
def prune_and_analyze(context: dg.OpExecutionContext, warehouse: WarehouseResource) -> None:
    """Records past their retention deleted, planner statistics refreshed."""
    with warehouse.connect() as conn:
        pruned = run_maintenance(conn, context.instance)
    for item in pruned:
        context.log.info(f"{item.name}: {item.rows} removed (older than {item.days} days)")


# A night's deletions take minutes; a run stuck past an hour is canceled.
@dg.job(name=MAINTENANCE_JOB, tags={MAX_RUNTIME_TAG: str(HOUR)})
def maintenance_job() -> None:
    prune_and_analyze()
