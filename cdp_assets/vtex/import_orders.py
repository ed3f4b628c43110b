"""Orders older than the two years VTEX's API serves, imported from a file of Get order
documents: NDJSON (one document a line), gzip-compressed or not.

Each document goes through the checks, quarantine and upsert of the orders the API lands, so
an import can be repeated: the second time, nothing changes. A file document never replaces
a stored order with a newer change stamp.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path

import orjson
import psycopg

from cdp_assets.lib.rejects import Reject
from cdp_assets.lib.sync_state import record_imported_months
from cdp_assets.lib.upsert import Row
from cdp_assets.tenants.registry import vtex_orders_available_from
from cdp_assets.vtex.records import InvalidRecord, OrderRow, order_row, reject
from cdp_assets.vtex.sync import ORDERS, Landing, land

GZIP_MAGIC = b"\x1f\x8b"


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of the file's non-blank lines, read as a stream."""
    with path.open("rb") as probe:
        compressed = probe.read(2) == GZIP_MAGIC
    with gzip.open(path, "rb") if compressed else path.open("rb") as file:
        for number, line in enumerate(file, 1):
            if line.strip():
                yield number, line.rstrip(b"\r\n")


def _record(number: int, line: bytes, source: str) -> OrderRow | Reject:
    try:
        document = orjson.loads(line)
    except orjson.JSONDecodeError:
        return reject(InvalidRecord(f"line {number} of {source} is not valid JSON"), line)
    try:
        return order_row(document, line)
    except InvalidRecord as error:
        return reject(error, line)


def import_orders(conn: psycopg.Connection, tenant_id: str, path: Path, run_id: str) -> Landing:
    """Land the file's orders for the tenant; what landed. The months they fill that VTEX no
    longer serves are recorded as imported (`cdp.order_months`)."""
    landing = Landing()
    months: set[date] = set()

    def records() -> Iterator[Row | Reject]:
        for number, line in _lines(path):
            record = _record(number, line, path.name)
            if not isinstance(record, Reject):
                created = record[2]
                months.add(date(created.year, created.month, 1))
            yield record

    land(conn, ORDERS, tenant_id, records(), run_id, landing)
    available_from = vtex_orders_available_from(datetime.now(UTC)).date()
    unavailable = {month for month in months if month < available_from.replace(day=1)}
    record_imported_months(conn, tenant_id, unavailable, run_id)
    conn.commit()
    return landing
