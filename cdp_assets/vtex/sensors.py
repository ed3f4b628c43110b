"""The orders feed's sensor: every 30 seconds, a drain for each tenant whose feed is on, as one
run per block of neighbouring tenants, so that 41 busy feeds are one run a tick, not 41.

The sensor only reads Postgres and the run storage; every VTEX call happens in the run.
"""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import dagster as dg

from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import TENANT_PARTITIONS
from cdp_assets.tenants.runs import block_request, run_priority, run_tenants_of, tenant_blocks
from cdp_assets.vtex.feed import FeedState, enabled_feeds
from cdp_assets.vtex.jobs import FEED_SYNC_JOB, vtex_orders_feed_sync

# A feed whose last drain found nothing is polled this often instead of every tick: the
# first order after a quiet spell waits up to this long, within the minutes an order takes
# to reach the ad platforms; the drains of neighbouring tenants share a run.
IDLE_POLL = timedelta(minutes=2)
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def feed_run_requests(
    feeds: list[FeedState], partition_keys: set[str], in_flight: set[str], now: datetime
) -> list[dg.RunRequest]:
    """One drain run per tenant whose feed is on and has a partition, in priority order, unless
    one is queued or running already, or its last drain found nothing less than IDLE_POLL ago.
    """
    requests = []
    for feed in feeds:
        tenant_id = feed.tenant.tenant_id
        if tenant_id not in partition_keys or tenant_id in in_flight:
            continue
        if (
            feed.last_events == 0
            and feed.last_drained_at is not None
            and now - feed.last_drained_at < IDLE_POLL
        ):
            continue
        requests.append(
            dg.RunRequest(
                run_key=f"{tenant_id}|{now:%Y%m%d%H%M%S}",
                partition_key=tenant_id,
                tags=run_priority(feed.tenant),
            )
        )
    return requests


def feed_runs_in_flight(instance: dg.DagsterInstance, partition_order: Sequence[str]) -> set[str]:
    """Tenants with a drain run queued or running (alone or in a block)."""
    runs = instance.get_runs(filters=dg.RunsFilter(job_name=FEED_SYNC_JOB, statuses=IN_FLIGHT))
    return set().union(*(run_tenants_of(run, partition_order) for run in runs))


def feed_block_requests(
    feeds: list[FeedState], partition_order: Sequence[str], in_flight: set[str], now: datetime
) -> list[dg.RunRequest]:
    """The drains due (feed_run_requests) as one run per block of neighbouring tenants."""
    due = feed_run_requests(feeds, set(partition_order), in_flight, now)
    due_ids = {request.partition_key for request in due}
    due_tenants = [feed.tenant for feed in feeds if feed.tenant.tenant_id in due_ids]
    return [
        block_request(block, f"{now:%Y%m%d%H%M%S}")
        for block in tenant_blocks(partition_order, due_tenants)
    ]


# RUNNING by default: a tenant's feed is turned on explicitly (`cdp tenants feed --on`, which
# configures it on VTEX), and the sensor requests nothing for the others. Stopped by default,
# a feed turned on would fill until its events expire unread.
@dg.sensor(
    job=vtex_orders_feed_sync,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every 30 seconds, a drain of the orders feed for each active tenant whose feed is"
    " on (`cdp tenants feed --on`): one run per block of neighbouring tenants due, at most one"
    f" drain in flight per tenant, and only every {IDLE_POLL // timedelta(minutes=1)} minutes"
    " while a tenant's last drain found nothing.",
)
def vtex_orders_feed_sensor(
    context: dg.SensorEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    with warehouse.connect() as conn:
        feeds = enabled_feeds(conn)
    if not feeds:
        return dg.SkipReason("no tenant has the orders feed on")
    partition_order = context.instance.get_dynamic_partitions(TENANT_PARTITIONS)
    now = datetime.now(UTC)
    in_flight = feed_runs_in_flight(context.instance, partition_order)
    requests = feed_block_requests(feeds, partition_order, in_flight, now)
    return requests or dg.SkipReason(
        f"{len(feeds)} feeds on: drains in flight, idle, or awaiting a tenant partition"
    )
