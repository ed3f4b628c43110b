"""The orders feed in Dagster: a per-tenant asset that drains it, its job, and the sensor that
requests a drain every minute for each tenant whose feed is on: one run per block of
neighbouring tenants, so that 41 busy feeds are one run a minute, not 41.

The sensor only reads Postgres and the run storage; every VTEX call happens in the run.
"""

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

import dagster as dg

from cdp_assets.lib.dagster_home import VTEX_API_POOL
from cdp_assets.lib.run_bounds import run_bound
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import TENANT_PARTITIONS, tenants
from cdp_assets.tenants.registry import get_tenant
from cdp_assets.tenants.runs import block_request, run_priority, run_tenants_of, tenant_blocks
from cdp_assets.vtex.feed import (
    MAX_LOTS_PER_RUN,
    FeedDrain,
    FeedState,
    drain_feed,
    enabled_feeds,
)
from cdp_assets.vtex.resources import VtexResource

FEED_SYNC_JOB = "vtex_orders_feed_sync"
# The drain's metadata naming the tenants whose orders it changed.
TENANTS_LANDED = "tenants_landed"
# A feed whose last drain found nothing is polled this often instead of every minute: the
# first order after a quiet spell waits up to this long, within the minutes an order takes
# to reach the ad platforms; the drains of neighbouring tenants share a run.
IDLE_POLL = timedelta(minutes=2)
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
    # Every tenant of a block in one run: a run's start costs more than a minute's drain.
    backfill_policy=dg.BackfillPolicy.single_run(),
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
) -> Iterator[dg.AssetMaterialization | dg.MaterializeResult]:
    """Orders changed since the last drain, from the tenants' VTEX orders feed (v3): each event's
    order is re-read with Get order and upserted into raw_vtex.orders, and the events are
    committed on VTEX only once the rows are. Malformed events are quarantined; an order that
    cannot be read keeps its events queued, then is re-read by id by the next drains
    (raw_vtex.orders_to_reread). Turned on per tenant with `cdp tenants feed`. A run over a
    block of tenants drains each in turn; one tenant's failure leaves the others drained and
    recorded, and fails the run naming it."""
    drains: dict[str, FeedDrain] = {}
    failed: dict[str, str] = {}
    for tenant_id in sorted(context.partition_keys):
        try:
            with warehouse.connect() as conn:
                client = vtex.client_for(get_tenant(conn, tenant_id))
                drains[tenant_id] = drain_feed(
                    conn, client, tenant_id, context.run.run_id, max_lots=config.max_lots
                )
        except Exception as error:  # noqa: BLE001 (reported below, after the other tenants)
            failed[tenant_id] = f"{type(error).__name__}: {str(error)[:300]}"
            continue
        if drains[tenant_id].recreated:
            context.log.warning(
                f"{tenant_id}: VTEX had deleted the orders feed (no event for a whole retention"
                " period); recreated it. Changes made meanwhile arrive with the List sync."
            )
    if failed:
        # The run fails, naming the failed tenants, but the tenants drained still record their
        # drains: the refresh after the feed (analytics/feed_changes.py) follows these
        # materializations, and their events are committed on VTEX already, so no later drain
        # would announce the orders they landed. A failed tenant's events stay queued.
        for tenant_id, drain in drains.items():
            yield dg.AssetMaterialization(
                context.asset_key, partition=tenant_id, metadata=drains_metadata({tenant_id: drain})
            )
        reasons = "; ".join(f"{tenant_id}: {reason}" for tenant_id, reason in failed.items())
        raise dg.Failure(
            f"the orders feed could not be drained for {reasons}",
            metadata={"tenants_failed": dg.MetadataValue.json(sorted(failed))},
        )
    yield dg.MaterializeResult(metadata=drains_metadata(drains))


def drains_metadata(drains: dict[str, FeedDrain]) -> dict:
    """One drain's metadata; for several, their counts added up (the oldest event's age: the
    oldest of them). `tenants_landed` names the tenants whose drain changed rows: what the
    refresh after the feed reads (each tenant of a run records the same metadata)."""
    totals: dict = {}
    for drain in drains.values():
        for key, value in drain.metadata().items():
            if key == "feed_oldest_event_age_seconds":
                totals[key] = max(totals.get(key, 0), value)
            elif isinstance(value, bool):
                totals[key] = totals.get(key, False) or value
            else:
                totals[key] = totals.get(key, 0) + value
    landed = sorted(
        tenant_id
        for tenant_id, drain in drains.items()
        if drain.landing.counts.inserted or drain.landing.counts.updated
    )
    return {**totals, TENANTS_LANDED: dg.MetadataValue.json(landed)}


vtex_orders_feed_sync = dg.define_asset_job(
    FEED_SYNC_JOB,
    selection=[vtex_orders_feed],
    description="Drain the VTEX orders feed of a tenant, or of a block of neighbouring tenants,"
    " into raw_vtex.orders.",
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


def feed_runs_in_flight(instance: dg.DagsterInstance, partition_order: Sequence[str]) -> set[str]:
    """Tenants with a drain run queued or running (alone or in a block)."""
    runs = instance.get_runs(filters=dg.RunsFilter(job_name=FEED_SYNC_JOB, statuses=IN_FLIGHT))
    return set().union(*(run_tenants_of(run, partition_order) for run in runs))


def feed_block_requests(
    due: list[dg.RunRequest], feeds: list[FeedState], partition_order: Sequence[str], now: datetime
) -> list[dg.RunRequest]:
    """The drains `due` (one per tenant) as one run per block of neighbouring tenants."""
    due_ids = {request.partition_key for request in due}
    due_tenants = [feed.tenant for feed in feeds if feed.tenant.tenant_id in due_ids]
    return [
        block_request(block, f"{now:%Y%m%d%H%M}")
        for block in tenant_blocks(partition_order, due_tenants)
    ]


# RUNNING by default: a tenant's feed is turned on explicitly (`cdp tenants feed --on`, which
# configures it on VTEX), and the sensor requests nothing for the others. Stopped by default,
# a feed turned on would fill until its events expire unread.
@dg.sensor(
    job=vtex_orders_feed_sync,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every minute, a drain of the orders feed for each active tenant whose feed is"
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
    due = feed_run_requests(
        feeds, set(partition_order), feed_runs_in_flight(context.instance, partition_order), now
    )
    requests = feed_block_requests(due, feeds, partition_order, now)
    return requests or dg.SkipReason(
        f"{len(feeds)} feeds on: drains in flight, idle, or awaiting a tenant partition"
    )
