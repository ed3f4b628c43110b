"""Fetch VTEX documents for one tenant and land them in `raw_vtex.*` in bounded batches.

Each batch commits on its own (rows, rejects), so memory stays flat and a crash loses at
most one batch of work; cursors move only after the whole window has landed. A document
the warehouse refuses is quarantined alone, and an order whose detail cannot be read is
recorded to be read again: neither holds back the rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from itertools import chain, islice
from typing import Any

import orjson
import psycopg

from cdp_assets.lib.rejects import (
    Reject,
    Unreadable,
    record_rejects,
    settle_unread,
    unread_orders,
)
from cdp_assets.lib.upsert import (
    ROW_ERRORS,
    RawTable,
    Row,
    UpsertCounts,
    upsert_documents,
    upsert_isolating,
)
from cdp_assets.vtex.client import (
    MalformedBody,
    MalformedEnvelope,
    OrderListing,
    Reply,
    RequestStats,
    VtexClient,
    VtexRequestFailed,
    naming_tenant,
)
from cdp_assets.vtex.records import (
    InvalidRecord,
    catalog_row,
    customer_row,
    order_row,
    reject,
)

ORDERS = RawTable("raw_vtex", "orders", "order_id", ("creation_date", "summary"))
PRODUCTS = RawTable("raw_vtex", "products", "product_id")
SKUS = RawTable("raw_vtex", "skus", "sku_id")
CUSTOMERS = RawTable("raw_vtex", "customers", "customer_id")

BATCH_SIZE = 2000
# Order details failing one after another: Get order is down, not one order unreadable. The
# run fails (and is retried) rather than record a whole month unread, one slow retry each.
UNREAD_IN_A_ROW = 50


@dataclass
class Landing:
    """What one sync did, for materialization metadata."""

    counts: UpsertCounts = field(default_factory=UpsertCounts)
    rejected: int = 0
    api: RequestStats = field(default_factory=RequestStats)
    started: float = field(default_factory=time.monotonic)
    # The pace the client kept: the request budget its requests are judged against.
    requests_per_second: float | None = None

    @property
    def received(self) -> int:
        return self.counts.inserted + self.counts.updated + self.counts.unchanged + self.rejected

    def count_requests(self, client: VtexClient) -> None:
        """Add a finished client's request counts."""
        stats = client.stats
        self.api.count(requests=stats.requests, throttled=stats.throttled, retries=stats.retries)
        self.requests_per_second = client.limiter.rate

    def row_metadata(self) -> dict[str, int]:
        """What landed."""
        return {
            "rows_received": self.received,
            "rows_inserted": self.counts.inserted,
            "rows_updated": self.counts.updated,
            "rows_unchanged": self.counts.unchanged,
            "rows_rejected": self.rejected,
        }

    def request_metadata(self) -> dict[str, float | int]:
        """The VTEX requests made, at what pace, and the time taken, which the operations
        metrics read."""
        rate = self.requests_per_second
        pace = {"api_requests_per_second": rate} if rate else {}
        return {
            "api_requests": self.api.requests,
            "api_429_responses": self.api.throttled,
            "api_retries": self.api.retries,
            **pace,
            "seconds": round(time.monotonic() - self.started, 3),
        }

    def metadata(self) -> dict[str, float | int]:
        return {**self.row_metadata(), **self.request_metadata()}


def land(
    conn: psycopg.Connection,
    table: RawTable,
    tenant_id: str,
    records: Iterable[Row | Reject],
    run_id: str,
    landing: Landing,
    *,
    replace: bool = False,
) -> None:
    """Upsert valid rows and quarantine rejects, committing after each batch (and whatever
    the caller's transaction held). `replace`: see `upsert_documents`.

    A batch the warehouse refuses for some rows' content is rolled back and landed again
    without them, found by halving it (`upsert_isolating`); they are quarantined with
    Postgres' reason, in the same commit as the rest of the batch.

    An explicit commit, not `conn.transaction()`: inside a transaction the caller already
    opened (any earlier SELECT opens one) that is only a savepoint, and nothing would be
    durable until the caller's connection closed.
    """
    records = iter(records)
    while batch := list(islice(records, BATCH_SIZE)):
        rows = [r for r in batch if not isinstance(r, Reject)]
        rejects = [r for r in batch if isinstance(r, Reject)]
        try:
            try:
                counts = upsert_documents(conn, table, tenant_id, rows, replace=replace)
            except ROW_ERRORS:
                conn.rollback()
                counts, refused = upsert_isolating(conn, table, tenant_id, rows, replace=replace)
                rejects += [Reject(r.row[0], r.reason, r.row[-1]) for r in refused]
            record_rejects(conn, tenant_id, table.name, rejects, run_id)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        landing.counts.add(counts)
        landing.rejected += len(rejects)


def _detail(
    fetch: Callable[[Any], Reply | None], key: Any, to_row: Callable[[Reply], Row]
) -> Row | Reject:
    try:
        reply: Reply | None = fetch(key)
    except MalformedBody as error:
        return reject(InvalidRecord("response body is not valid JSON", str(key)), error.raw)
    if reply is None:
        return Reject(str(key), "listed, but its detail answered 404", "")
    try:
        return to_row(reply)
    except InvalidRecord as error:
        return reject(error, reply.raw)


@dataclass(frozen=True)
class OrdersRead:
    """What one read of a span of orders found."""

    listing: OrderListing
    unread: list[Unreadable]


def sync_orders(
    client: VtexClient,
    conn: psycopg.Connection,
    tenant_id: str,
    start: datetime,
    end: datetime,
    run_id: str,
    landing: Landing,
    *,
    replace: bool = False,
) -> OrdersRead:
    """Land every order listed as created in [start, end], and those of its months an earlier
    run left unread. An order whose detail still fails after the client's retries (or answers
    an empty body) is recorded in `raw_vtex.unreadable_orders` and the others land; the next
    run of its month reads it again. Entries listed without an orderId are quarantined."""
    with naming_tenant(tenant_id):
        listing = client.list_orders(start, end)
        earlier = {u.order_id: u for u in unread_orders(conn, tenant_id, start, end)}
        order_ids = sorted(listing.orders.keys() | earlier.keys())
        unread: list[Unreadable] = []

        def read(order_id: str) -> Row | Reject | Unreadable:
            try:
                return _detail(client.get_order, order_id, lambda r: order_row(r.data, r.raw))
            except (VtexRequestFailed, MalformedEnvelope) as error:
                return _unreadable(order_id, listing, earlier.get(order_id), start, error)

        def readable(details: Iterable[Row | Reject | Unreadable]) -> Iterator[Row | Reject]:
            in_a_row = 0
            for detail in details:
                if not isinstance(detail, Unreadable):
                    in_a_row = 0
                    yield detail
                    continue
                unread.append(detail)
                in_a_row += 1
                if in_a_row == UNREAD_IN_A_ROW:
                    raise VtexRequestFailed(
                        f"Get order failed for {in_a_row} orders in a row (the last:"
                        f" {detail.error})"
                    )

        unlisted = [Reject(None, entry.problem, entry.raw) for entry in listing.unlisted]
        details = readable(client.map_concurrent(read, order_ids))
        land(conn, ORDERS, tenant_id, chain(unlisted, details), run_id, landing, replace=replace)
        still = {u.order_id for u in unread}
        settle_unread(conn, tenant_id, earlier.keys() - still, unread, run_id)
        conn.commit()
    return OrdersRead(listing, unread)


def _unreadable(
    order_id: str,
    listing: OrderListing,
    earlier: Unreadable | None,
    start: datetime,
    error: Exception,
) -> Unreadable:
    """An order whose detail could not be read, in the month its creation falls in."""
    listed = listing.orders.get(order_id)
    if listed is not None and listed.created is not None:
        month, status = date(listed.created.year, listed.created.month, 1), listed.status
    elif earlier is not None:
        month, status = earlier.month, earlier.status
    else:
        month, status = date(start.year, start.month, 1), None
    return Unreadable(order_id, month, status, str(error))


def sync_catalog(
    client: VtexClient, conn: psycopg.Connection, tenant_id: str, run_id: str, table: RawTable
) -> Landing:
    """Full read of products or SKUs: VTEX documents no change cursor for the catalog."""
    list_ids, fetch = {
        PRODUCTS.name: (client.product_ids, client.get_product),
        SKUS.name: (client.sku_ids, client.get_sku),
    }[table.name]
    landing = Landing()
    seen_at = datetime.now(UTC)
    with naming_tenant(tenant_id):
        details = client.map_concurrent(
            lambda key: _detail(fetch, key, lambda r: catalog_row(r.data, r.raw, "Id", seen_at)),
            list_ids(),
        )
        land(conn, table, tenant_id, details, run_id, landing)
    landing.count_requests(client)
    return landing


def sync_customers(
    client: VtexClient,
    conn: psycopg.Connection,
    tenant_id: str,
    run_id: str,
    updated_since: datetime | None,
) -> Landing:
    """Land the CL documents updated since a moment (all of them for None). The scroll never
    skips a page (see `VtexClient.scroll_customers`); when it fails, the run fails before the
    caller moves the customers cursor."""
    landing = Landing()

    def rows() -> Iterable[Row | Reject]:
        for page in client.scroll_customers(updated_since):
            for doc in page:
                try:
                    yield customer_row(doc)
                except InvalidRecord as error:
                    yield reject(error, orjson.dumps(doc))

    with naming_tenant(tenant_id):
        land(conn, CUSTOMERS, tenant_id, rows(), run_id, landing)
    landing.count_requests(client)
    return landing
