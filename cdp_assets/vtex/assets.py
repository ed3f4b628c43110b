"""VTEX documents landed raw in Postgres, one partition per tenant (orders: per month too),
and the orders feed drained per tenant, the tenants of a block in one run."""

import threading
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import psycopg

from cdp_assets.lib.dagster_home import VTEX_API_POOL
from cdp_assets.lib.redaction import redact
from cdp_assets.lib.step_retries import retry_transient
from cdp_assets.lib.sync_state import (
    FAILED,
    RECONCILED,
    UNAVAILABLE,
    UNRECONCILED,
    OrderMonth,
    get_cursor,
    record_order_month,
    set_cursor,
)
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import order_months, tenant_month_key, tenant_months, tenants
from cdp_assets.tenants.registry import (
    Tenant,
    get_tenant,
    list_tenants,
    vtex_orders_available_from,
)
from cdp_assets.vtex.client import VtexClient, VtexRequestFailed
from cdp_assets.vtex.feed import MAX_LOTS_PER_RUN, FeedDrain, drain_feed
from cdp_assets.vtex.resources import VtexResource
from cdp_assets.vtex.sync import (
    CUSTOMERS,
    PRODUCTS,
    SKUS,
    Landing,
    RawTable,
    sync_catalog,
    sync_customers,
    sync_orders,
)

# Orders keep changing after creation; re-reading the last 48 hours repairs what a
# previous sync saw too early (VTEX's list index lags by minutes).
OVERLAP = timedelta(hours=48)
GROUP = "vtex"
# The drain's metadata naming the tenants whose orders it changed.
TENANTS_LANDED = "tenants_landed"


class OrdersSyncConfig(dg.Config):
    full_refresh: bool = False
    """Re-read the whole month instead of resuming from the month's cursor minus 48 h."""


class CustomersSyncConfig(dg.Config):
    full_refresh: bool = False
    """Scroll every CL document instead of those updated since the cursor minus 48 h."""


# Tenants of a block drained at once, each on its own connection and client: a drain spends
# its time waiting on VTEX and Postgres, its feed reads one after another (each read returns
# the next lot), so one tenant at a time left a block's run mostly idle.
FEED_TENANTS_AT_ONCE = 4


class FeedDrainConfig(dg.Config):
    max_lots: int = MAX_LOTS_PER_RUN
    """Feed reads (up to 10 events each) in this run; the next run continues a longer queue."""


class TenantsFailed(Exception):
    """Several tenants of a run failed, one at least for a reason that may pass."""


# What outlived the client's own retries and may pass: VTEX still failing, or the database
# connection dropped.
TRANSIENT = (VtexRequestFailed, psycopg.OperationalError)


def _retry(context: dg.AssetExecutionContext, vtex: VtexResource) -> AbstractContextManager[None]:
    """Step retries for what may pass (TRANSIENT, TenantsFailed)."""
    return retry_transient(
        context, (*TRANSIENT, TenantsFailed), base_seconds=vtex.step_retry_base_seconds
    )


def _table_metadata(table: RawTable) -> dict:
    return {"dagster/table_name": f"{table.schema}.{table.name}"}


# What each month of a run over several records of its own; the requests and time are the run's.
MONTH_FIGURES = (
    *Landing().row_metadata(),
    "orders_listed",
    "vtex_reported",  # paging.total of List orders over the month's windows
    "orders_unread",  # listed, but Get order kept failing: read again by the next run
    "orders_unreconciled",  # reported by VTEX, on no page: the month is read again
)
# The month's `orders_sync`: how it ended.
UNAVAILABLE_FROM_VTEX = "unavailable from VTEX"
BEFORE_HISTORY = "before the history start"


def _month_figures(landing: Landing, sync: str, **counts: int) -> dict[str, int | str]:
    return {
        **landing.row_metadata(),
        **dict.fromkeys(MONTH_FIGURES[len(landing.row_metadata()) :], 0),
        **counts,
        "orders_sync": sync,
    }


def _sync_month(
    context: dg.AssetExecutionContext,
    config: OrdersSyncConfig,
    conn: psycopg.Connection,
    client: VtexClient,
    tenant: Tenant,
    month: str,
) -> dict[str, int | str]:
    """Land one month of a tenant's orders, record how it reconciles with VTEX's count, and
    move its cursor to the newest order read when it does; what happened."""
    landing = Landing()
    tenant_id, run_id = tenant.tenant_id, context.run.run_id
    window = order_months.time_window_for_partition_key(month)
    now = datetime.now(UTC)
    history_start = datetime.combine(tenant.history_start, datetime.min.time(), UTC)
    start, end = max(window.start, history_start), min(window.end, now)
    if start >= end:
        context.log.info(f"{tenant_id} {month}: before the history start, skipped")
        return _month_figures(landing, BEFORE_HISTORY)
    available_from = vtex_orders_available_from(now)
    month_start = date.fromisoformat(month)
    if end <= available_from:
        record_order_month(conn, tenant_id, month_start, OrderMonth(UNAVAILABLE), run_id)
        conn.commit()
        context.log.warning(
            f"{tenant_id} {month}: older than the two years VTEX serves orders for; import"
            " them with `cdp tenants import-orders`"
        )
        return _month_figures(landing, UNAVAILABLE_FROM_VTEX)
    start = max(start, available_from)
    cursor = None if config.full_refresh else get_cursor(conn, tenant_id, "orders", month)
    if cursor is not None:
        start = max(start, cursor - OVERLAP)
    read = sync_orders(
        client, conn, tenant_id, start, end, run_id, landing, replace=config.full_refresh
    )
    listing = read.listing
    reconciled = not listing.shortfalls
    shortfalls = "; ".join(
        f"{s.window}: {s.reported} reported, {s.found} read" for s in listing.shortfalls
    )
    record = OrderMonth(
        RECONCILED if reconciled else UNRECONCILED,
        vtex_reported=listing.reported,
        accounted=landing.received + len(read.unread),
        available_from=available_from if window.start < available_from else None,
        detail=shortfalls or None,
    )
    record_order_month(conn, tenant_id, month_start, record, run_id)
    # Only past what was read, and only once VTEX's count is accounted for: a wrong answer
    # (an empty page, a short one) leaves the window to be read again.
    if reconciled and listing.newest is not None:
        set_cursor(conn, tenant_id, "orders", min(listing.newest, end), run_id, scope=month)
    conn.commit()
    context.log.info(
        f"{tenant_id} {month}: {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC,"
        f" {landing.received} orders, {len(read.unread)} unread, {record.state}"
        + (f" ({shortfalls})" if shortfalls else "")
    )
    return _month_figures(
        landing,
        record.state,
        orders_listed=len(listing.orders),
        vtex_reported=listing.reported,
        orders_unread=len(read.unread),
        orders_unreconciled=listing.unaccounted,
    )


def _record_failed_month(
    context: dg.AssetExecutionContext,
    conn: psycopg.Connection,
    tenant_id: str,
    month: str,
    error: Exception,
) -> None:
    """The month shows as failed until a run of it succeeds, whatever newer months do. Best
    effort: the database may be what failed."""
    detail = redact(f"{type(error).__name__}: {error}")[:1000]
    try:
        conn.rollback()
        failed = OrderMonth(FAILED, detail=detail)
        record_order_month(conn, tenant_id, date.fromisoformat(month), failed, context.run.run_id)
        conn.commit()
    except psycopg.Error as unrecorded:
        context.log.warning(f"{tenant_id} {month}: failure not recorded ({unrecorded!r})")


# Tenants of a run synced at once, each on its own connection and client (the schedule's run
# covers a block of tenants: one run's start instead of one per tenant).
ORDER_TENANTS_AT_ONCE = 4


@dataclass
class TenantSync:
    """One tenant's months in a run: what each landed, or the error that stopped it."""

    tenant_id: str
    months: list[str]
    landed: dict[str, dict[str, int | str]] = field(default_factory=dict)
    client: VtexClient | None = None
    error: Exception | None = None
    stopped: threading.Event = field(default_factory=threading.Event)

    def stop(self) -> None:
        self.stopped.set()
        if self.client is not None:
            self.client.stop()


def _sync_tenant(
    context: dg.AssetExecutionContext,
    config: OrdersSyncConfig,
    warehouse: WarehouseResource,
    vtex: VtexResource,
    synced: TenantSync,
) -> None:
    """A tenant's months of the run, oldest first; a failed month is recorded failed and
    stops the tenant (reported once the run's other tenants are done)."""
    try:
        with warehouse.connect() as conn:
            tenant = get_tenant(conn, synced.tenant_id)
            synced.client = vtex.client_for(tenant)
            for month in sorted(synced.months):
                if synced.stopped.is_set():
                    return
                try:
                    synced.landed[month] = _sync_month(
                        context, config, conn, synced.client, tenant, month
                    )
                except Exception as error:
                    if not synced.stopped.is_set():
                        _record_failed_month(context, conn, synced.tenant_id, month, error)
                    raise
    except Exception as error:  # noqa: BLE001 (raised once the other tenants are done)
        synced.error = error


def _record_months_landed(
    context: dg.AssetExecutionContext, synced: list[TenantSync]
) -> Iterator[dg.AssetMaterialization]:
    """The months that landed, materialized though the run fails (a failed tenant's earlier
    months too): their cursors moved already, so what they landed must not wait for the
    failed months."""
    for tenant in synced:
        for month, landed in tenant.landed.items():
            yield dg.AssetMaterialization(
                context.asset_key,
                partition=tenant_month_key(tenant.tenant_id, month),
                metadata=landed,
            )


def _raise_for(synced: list[TenantSync]) -> None:
    """A run of one tenant fails with its error as it was; a run of several with one naming
    each tenant that failed. The step retries (every tenant of the run) when an error may pass."""
    failed = {t.tenant_id: t.error for t in synced if t.error is not None}
    if len(synced) == 1:
        raise next(iter(failed.values()))
    reasons = "; ".join(
        f"{tenant_id}: {type(error).__name__}: {redact(str(error))[:300]}"
        for tenant_id, error in failed.items()
    )
    message = f"orders could not be synced for {reasons}"
    if any(isinstance(error, TRANSIENT) for error in failed.values()):
        raise TenantsFailed(message) from next(iter(failed.values()))
    raise dg.Failure(message, metadata={"tenants_failed": dg.MetadataValue.json(sorted(failed))})


@dg.asset(
    name="vtex_orders",
    group_name=GROUP,
    partitions_def=tenant_months,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=24),
    pool=VTEX_API_POOL,
    kinds={"python", "postgres"},
    metadata={"dagster/table_name": "raw_vtex.orders"},
    tags={"domain": "orders"},
)
def vtex_orders(
    context: dg.AssetExecutionContext,
    config: OrdersSyncConfig,
    warehouse: WarehouseResource,
    vtex: VtexResource,
) -> Iterator[dg.AssetMaterialization | dg.MaterializeResult]:
    """VTEX OMS orders (List + Get order), raw JSONB keyed by (tenant, orderId), per month.

    A month first syncs whole (from the tenant's history start); later runs of the same month
    resume from its cursor minus 48 h, which is how the current month stays fresh. The cursor
    moves only to the newest order read, and only when what landed, was quarantined or is
    unread accounts for the orders VTEX reported; months older than the two years VTEX
    serves are recorded unavailable, never synced.

    In a run over several months, each month's materialization records the rows of that month;
    the VTEX requests and seconds are the whole run's, recorded on each. A run over a block of
    tenants (the twice-daily schedule's) syncs a few at once; one tenant's failure leaves the
    others synced and recorded, and fails the run naming it.
    """
    months_by_tenant: dict[str, list[str]] = defaultdict(list)
    for key in context.partition_keys:
        partition = tenant_months.get_partition_key_from_str(key)
        months_by_tenant[partition.keys_by_dimension["tenant"]].append(
            partition.keys_by_dimension["month"]
        )
    run = Landing()  # the VTEX requests and time of the whole run; each month lands its own
    with _retry(context, vtex):
        with warehouse.connect() as conn:
            priority = {tenant.tenant_id: tenant.priority for tenant in list_tenants(conn)}
        by_priority = sorted(months_by_tenant, key=lambda tenant_id: priority.get(tenant_id, 0))
        synced = [TenantSync(tenant_id, months_by_tenant[tenant_id]) for tenant_id in by_priority]
        pool = ThreadPoolExecutor(ORDER_TENANTS_AT_ONCE, thread_name_prefix="orders")
        try:
            list(
                pool.map(
                    lambda tenant: _sync_tenant(context, config, warehouse, vtex, tenant), synced
                )
            )
        except BaseException:
            # Interrupted (a cancelled run): the tenants under way stop their requests now.
            for tenant in synced:
                tenant.stop()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        done = [tenant for tenant in synced if tenant.error is None]
        for tenant in synced:
            if tenant.client is not None:
                run.count_requests(tenant.client)
        if len(done) < len(synced):
            yield from _record_months_landed(context, synced)
            _raise_for(synced)
    for tenant in done:
        for month, landed in tenant.landed.items():
            context.add_asset_metadata(
                landed, partition_key=tenant_month_key(tenant.tenant_id, month)
            )
    unread = sum(int(landed["orders_unread"]) for t in done for landed in t.landed.values())
    if unread:
        context.log.warning(
            f"{unread} orders left unread (Get order kept failing): raw_vtex.unreadable_orders"
            " holds them, and the next run of their month reads them again"
        )
    yield dg.MaterializeResult(
        metadata={
            **run.request_metadata(),
            "months": len(context.partition_keys),
            "orders_unread_in_run": unread,
        }
    )


def _whole_tenant_asset(name: str, table: RawTable, description: str) -> dg.AssetsDefinition:
    """Catalog entities: one full read per tenant partition."""

    @dg.asset(
        name=name,
        group_name=GROUP,
        partitions_def=tenants,
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=1),
        pool=VTEX_API_POOL,
        kinds={"python", "postgres"},
        metadata=_table_metadata(table),
        description=description,
    )
    def _asset(
        context: dg.AssetExecutionContext, warehouse: WarehouseResource, vtex: VtexResource
    ) -> dg.MaterializeResult:
        tenant_id = context.partition_key
        with _retry(context, vtex), warehouse.connect() as conn:
            client = vtex.client_for(get_tenant(conn, tenant_id))
            started = datetime.now(UTC)
            landing = sync_catalog(client, conn, tenant_id, context.run.run_id, table)
            with conn.transaction():
                set_cursor(conn, tenant_id, table.name, started, context.run.run_id)
        return dg.MaterializeResult(metadata=landing.metadata())

    return _asset


vtex_products = _whole_tenant_asset(
    "vtex_products", PRODUCTS, "VTEX catalog products (GetProductAndSkuIds + product detail)."
)
vtex_skus = _whole_tenant_asset(
    "vtex_skus", SKUS, "VTEX catalog SKUs (stockkeepingunitids + SKU context)."
)


@dg.asset(
    group_name=GROUP,
    partitions_def=tenants,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=1),
    pool=VTEX_API_POOL,
    kinds={"python", "postgres"},
    metadata=_table_metadata(CUSTOMERS),
)
def vtex_customers(
    context: dg.AssetExecutionContext,
    config: CustomersSyncConfig,
    warehouse: WarehouseResource,
    vtex: VtexResource,
) -> dg.MaterializeResult:
    """Master Data CL customers via scroll: the real e-mails (orders only carry masked ones)."""
    tenant_id = context.partition_key
    with _retry(context, vtex), warehouse.connect() as conn:
        client = vtex.client_for(get_tenant(conn, tenant_id))
        started = datetime.now(UTC)
        cursor = None if config.full_refresh else get_cursor(conn, tenant_id, CUSTOMERS.name)
        since = cursor - OVERLAP if cursor else None
        landing = sync_customers(client, conn, tenant_id, context.run.run_id, since)
        with conn.transaction():
            set_cursor(conn, tenant_id, CUSTOMERS.name, started, context.run.run_id)
    return dg.MaterializeResult(metadata={**landing.metadata(), "incremental": since is not None})


@dg.asset(
    group_name=GROUP,
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
    tenant_ids = sorted(context.partition_keys)
    pool = ThreadPoolExecutor(FEED_TENANTS_AT_ONCE, thread_name_prefix="feed")
    try:
        outcomes = dict(
            zip(
                tenant_ids,
                pool.map(
                    lambda tenant_id: _drain_tenant(
                        warehouse, vtex, tenant_id, context.run.run_id, config.max_lots
                    ),
                    tenant_ids,
                ),
                strict=True,
            )
        )
    finally:
        # An interrupted run starts no further drain; those under way end their round.
        pool.shutdown(wait=True, cancel_futures=True)
    drains = {t: outcome for t, outcome in outcomes.items() if isinstance(outcome, FeedDrain)}
    failed = {t: outcome for t, outcome in outcomes.items() if isinstance(outcome, str)}
    for tenant_id, drain in drains.items():
        if drain.recreated:
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
                context.asset_key, partition=tenant_id, metadata=drain_metadata(tenant_id, drain)
            )
        reasons = "; ".join(f"{tenant_id}: {reason}" for tenant_id, reason in failed.items())
        raise dg.Failure(
            f"the orders feed could not be drained for {reasons}",
            metadata={"tenants_failed": dg.MetadataValue.json(sorted(failed))},
        )
    for tenant_id, drain in drains.items():
        context.add_asset_metadata(drain_metadata(tenant_id, drain), partition_key=tenant_id)
    yield dg.MaterializeResult()


def _drain_tenant(
    warehouse: WarehouseResource, vtex: VtexResource, tenant_id: str, run_id: str, max_lots: int
) -> FeedDrain | str:
    """A tenant's drain, or why it failed (reported once the block's other tenants are done)."""
    try:
        with warehouse.connect() as conn:
            client = vtex.client_for(get_tenant(conn, tenant_id))
            return drain_feed(conn, client, tenant_id, run_id, max_lots=max_lots)
    except Exception as error:  # noqa: BLE001 (the run fails naming it, after the others)
        return f"{type(error).__name__}: {str(error)[:300]}"


def drain_metadata(tenant_id: str, drain: FeedDrain) -> dict:
    """A tenant's drain, on its own partition (a block run records each tenant's counts, not
    the run's). `tenants_landed` names the tenant when its drain changed rows: what the refresh
    after the feed reads."""
    counts = drain.landing.counts
    landed = [tenant_id] if counts.inserted or counts.updated else []
    return {**drain.metadata(), TENANTS_LANDED: dg.MetadataValue.json(landed)}
