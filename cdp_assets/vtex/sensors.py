"""The orders feed's sensor: every 30 seconds, a drain for each tenant whose feed is on, as one
run per block of neighbouring tenants, so that 41 busy feeds are one run a tick, not 41.

The sensor only reads Postgres and the run storage; every VTEX call happens in the run.
"""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import dagster as dg

from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import TENANT_PARTITIONS
from cdp_assets.tenants.registry import Tenant
from cdp_assets.tenants.runs import block_request, run_tenants_of, runs_in_flight, tenant_blocks
from cdp_assets.vtex.feed import FeedState, enabled_feeds
from cdp_assets.vtex.jobs import FEED_SYNC_JOB, vtex_orders_feed_sync

# A feed whose last drain found nothing is polled this often instead of every tick: the
# first order after a quiet spell waits up to this long, within the minutes an order takes
# to reach the ad platforms; the drains of neighbouring tenants share a run.
IDLE_POLL = timedelta(minutes=2)


def due_feeds(
    feeds: list[FeedState], partition_keys: set[str], in_flight: set[str], now: datetime
) -> list[Tenant]:
    """The tenants whose feed is on and has a partition, in priority order, but those with a
    drain queued or running already, or whose last drain found nothing less than IDLE_POLL
    ago."""
    return [
        feed.tenant
        for feed in feeds
        if feed.tenant.tenant_id in partition_keys
        and feed.tenant.tenant_id not in in_flight
        and not (
            feed.last_events == 0
            and feed.last_drained_at is not None
            and now - feed.last_drained_at < IDLE_POLL
        )
    ]


def feed_runs_in_flight(instance: dg.DagsterInstance, partition_order: Sequence[str]) -> set[str]:
    """Tenants with a drain run queued or running (alone or in a block)."""
    records = runs_in_flight(instance, FEED_SYNC_JOB)
    return set().union(*(run_tenants_of(r.dagster_run, partition_order) for r in records))


def feed_block_requests(
    feeds: list[FeedState], partition_order: Sequence[str], in_flight: set[str], now: datetime
) -> list[dg.RunRequest]:
    """The drains due (due_feeds) as one run per block of neighbouring tenants."""
    due = due_feeds(feeds, set(partition_order), in_flight, now)
    return [
        block_request(block, f"{now:%Y%m%d%H%M%S}") for block in tenant_blocks(partition_order, due)
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
