"""The orders feed in Dagster: a per-tenant asset that drains it, its job, and the sensor that
requests a drain run every minute for each tenant whose feed is on.

The sensor only reads Postgres and the run storage; every VTEX call happens in the run.
"""

from datetime import UTC, datetime, timedelta

import dagster as dg

from cdp_assets.lib.dagster_home import VTEX_API_POOL
from cdp_assets.lib.run_bounds import run_bound
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import tenants
from cdp_assets.tenants.registry import get_tenant
from cdp_assets.tenants.runs import run_priority
from cdp_assets.vtex.feed import MAX_LOTS_PER_RUN, FeedState, drain_feed, enabled_feeds
from cdp_assets.vtex.resources import VtexResource

FEED_SYNC_JOB = "vtex_orders_feed_sync"
# A feed whose last drain found nothing is polled this often instead of every minute:
# one run per tenant and minute would mostly be empty runs.
IDLE_POLL = timedelta(minutes=5)
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


class FeedDrainConfig(dg.Config):
    max_lots: int = MAX_LOTS_PER_RUN
    """Feed reads (up to 10 events each) in this run; the next run continues a longer queue."""


@dg.asset(
    group_name="vtex",
    partitions_def=tenants,
    pool=VTEX_API_POOL,
    kinds={"python", "postgres"},
    metadata={"dagster/table_name": "raw_vtex.orders"},
    tags={"domain": "orders"},
)
def vtex_orders_feed(
    context: dg.AssetExecutionContext,
    config: FeedDrainConfig,
    warehouse: WarehouseResource,
    vtex: VtexResource,
) -> dg.MaterializeResult:
    """Orders changed since the last drain, from the tenant's VTEX orders feed (v3): each event's
    order is re-read with Get order and upserted into raw_vtex.orders, and the events are
    committed on VTEX only once the rows are. Malformed events are quarantined; an order that
    cannot be read keeps its events queued, then is re-read by id by the next drains
    (raw_vtex.orders_to_reread). Turned on per tenant with `cdp tenants feed`."""
    tenant_id = context.partition_key
    with warehouse.connect() as conn:
        client = vtex.client_for(get_tenant(conn, tenant_id))
        drain = drain_feed(conn, client, tenant_id, context.run.run_id, max_lots=config.max_lots)
    if drain.recreated:
        context.log.warning(
            f"{tenant_id}: VTEX had deleted the orders feed (no event for a whole retention"
            " period); recreated it. Changes made meanwhile arrive with the List sync."
        )
    return dg.MaterializeResult(metadata=drain.metadata())


vtex_orders_feed_sync = dg.define_asset_job(
    FEED_SYNC_JOB,
    selection=[vtex_orders_feed],
    description="Drain one tenant's VTEX orders feed into raw_vtex.orders.",
    tags=run_bound(FEED_SYNC_JOB),
)


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
                run_key=f"{tenant_id}|{now:%Y%m%d%H%M}",
                partition_key=tenant_id,
                tags=run_priority(feed.tenant),
            )
        )
    return requests


def feed_runs_in_flight(instance: dg.DagsterInstance) -> set[str]:
    """Tenants with a drain run queued or running."""
    runs = instance.get_runs(filters=dg.RunsFilter(job_name=FEED_SYNC_JOB, statuses=IN_FLIGHT))
    return {run.tags["dagster/partition"] for run in runs if "dagster/partition" in run.tags}


# RUNNING by default: a tenant's feed is turned on explicitly (`cdp tenants feed --on`, which
# configures it on VTEX), and the sensor requests nothing for the others. Stopped by default,
# a feed turned on would fill until its events expire unread.
@dg.sensor(
    job=vtex_orders_feed_sync,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every minute, a drain of the orders feed for each active tenant whose feed is"
    " on (`cdp tenants feed --on`): at most one run in flight per tenant, and only every"
    f" {IDLE_POLL // timedelta(minutes=1)} minutes while its last drain found nothing.",
)
def vtex_orders_feed_sensor(
    context: dg.SensorEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    with warehouse.connect() as conn:
        feeds = enabled_feeds(conn)
    if not feeds:
        return dg.SkipReason("no tenant has the orders feed on")
    partition_keys = set(context.instance.get_dynamic_partitions(tenants.name))
    requests = feed_run_requests(
        feeds, partition_keys, feed_runs_in_flight(context.instance), datetime.now(UTC)
    )
    return requests or dg.SkipReason(
        f"{len(feeds)} feeds on: drains in flight, idle, or awaiting a tenant partition"
    )
