"""How long a run of each job may last, as the `dagster/max_runtime` tag its runs carry.

Dagster's run monitoring (the daemon) cancels a run past its bound and marks it failed, so a
run stuck on a call that never ends frees its tenant's place in the run queue (one run per
tenant partition at a time) and its pool slots. Runs without the tag (a backfill launched from
an asset's page, an automation run) get the instance's `max_runtime_seconds`
(`deploy/dagster.yaml`, `lib/dagster.yaml`). The tag needs no instance setting, which is how
the bound also holds on Dagster's Helm chart, whose values have no place for one.
"""

from __future__ import annotations

MAX_RUNTIME_TAG = "dagster/max_runtime"
HOUR = 3600
# Seconds, by job name: several times what a large tenant's run takes.
RUN_BOUNDS = {
    "vtex_tenant_sync": 6 * HOUR,  # a large catalog and Master Data at 80 requests/s
    "vtex_orders_sync": 8 * HOUR,  # up to 24 months of a large tenant's orders
    "vtex_orders_feed_sync": 30 * 60,  # at most 1,000 events, every 30 seconds
    "analytics_tenant_refresh": 3 * HOUR,
    "churn_holdout_refresh": 3 * HOUR,
    "audiences_refresh": 2 * HOUR,
    "activation_push": 2 * HOUR,  # platforms process asynchronously: a push never waits on them
    "operations_metrics_job": 10 * 60,  # every 15 minutes
}


def run_bound(job_name: str) -> dict[str, str]:
    """The tags bounding the runs of `job_name` in time."""
    return {MAX_RUNTIME_TAG: str(RUN_BOUNDS[job_name])}
