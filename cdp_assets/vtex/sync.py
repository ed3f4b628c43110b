"""Fetch VTEX documents for one tenant and land them in `raw_vtex.*` in bounded batches.

Each batch commits on its own (rows, rejects), so memory stays flat and a crash loses at
most one batch of work; cursors move only after the whole window has landed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from typing import Any

import orjson
import psycopg

from cdp_assets.lib.rejects import Reject, record_rejects
from cdp_assets.lib.upsert import RawTable, Row, UpsertCounts, upsert_documents
from cdp_assets.vtex.client import MalformedBody, Reply, RequestStats, VtexClient
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
        pace = {"api_requests_per_second": self.requests_per_second}
        return {
            "api_requests": self.api.requests,
            "api_429_responses": self.api.throttled,
            "api_retries": self.api.retries,
            **(pace if self.requests_per_second else {}),
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
) -> None:
    """Upsert valid rows and quarantine rejects, committing after each batch.

    An explicit commit, not `conn.transaction()`: inside a transaction the caller already
    opened (any earlier SELECT opens one) that is only a savepoint, and nothing would be
    durable until the caller's connection closed.
    """
    records = iter(records)
    while batch := list(islice(records, BATCH_SIZE)):
        rows = [r for r in batch if not isinstance(r, Reject)]
        rejects = [r for r in batch if isinstance(r, Reject)]
        try:
            counts = upsert_documents(conn, table, tenant_id, rows)
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


def sync_orders(
    client: VtexClient,
    conn: psycopg.Connection,
    tenant_id: str,
    start: datetime,
    end: datetime,
    run_id: str,
    landing: Landing,
) -> int:
    """Land every order created in [start, end]; returns how many were listed."""
    order_ids = client.list_order_ids(start, end)
    details = client.map_concurrent(
        lambda order_id: _detail(client.get_order, order_id, lambda r: order_row(r.data, r.raw)),
        order_ids,
    )
    land(conn, ORDERS, tenant_id, details, run_id, landing)
    return len(order_ids)


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
    landing = Landing()

    def rows() -> Iterable[Row | Reject]:
        for page in client.scroll_customers(updated_since):
            for doc in page:
                try:
                    yield customer_row(doc)
                except InvalidRecord as error:
                    yield reject(error, orjson.dumps(doc))

    land(conn, CUSTOMERS, tenant_id, rows(), run_id, landing)
    landing.count_requests(client)
    return landing
