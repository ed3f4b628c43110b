"""Stage 1: the ingestion write path against the old way and the physical limit.

The same order documents (exported from the sandbox, spooled to a file so that no method holds
them all in memory) land three ways over the same connection:
- ours: `vtex.sync.land`, batches of 2,000 COPY'd into a temporary table and upserted with one
  `INSERT ... ON CONFLICT DO UPDATE` each, into a copy of `raw_vtex.orders` (key and indexes);
- the old workers' way: psycopg2 `executemany` of a row-by-row upsert in batches of 1,000, a
  commit per batch, into another copy of `raw_vtex.orders`;
- the limit: one plain COPY into a table of the same columns with no key and no index.
Ours also writes each order's summary (what staging reads, migration 0009); the other two
write the documents alone, as the old workers did.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from itertools import islice
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import psycopg
import psycopg2

from cdp_assets.lib.upsert import RawTable
from cdp_assets.vtex.records import order_row
from cdp_assets.vtex.sync import BATCH_SIZE, ORDERS, Landing, land
from cdp_devkit.bench.environment import Bench
from cdp_devkit.bench.measure import StageResult, stage

SCHEMA = "bench_write"
TENANT = "write_path"
OLD_BATCH = 1000
TABLES = {
    "ours": "orders_ours",
    "row_by_row": "orders_row_by_row",
    "copy": "orders_copy",
}
SETUP = f"""
DROP SCHEMA IF EXISTS {SCHEMA} CASCADE;
CREATE SCHEMA {SCHEMA};
CREATE TABLE {SCHEMA}.orders_ours (LIKE raw_vtex.orders INCLUDING ALL);
CREATE TABLE {SCHEMA}.orders_row_by_row (LIKE raw_vtex.orders INCLUDING ALL);
CREATE TABLE {SCHEMA}.orders_copy (LIKE raw_vtex.orders INCLUDING DEFAULTS INCLUDING COMPRESSION);
"""
# The old workers' statement: one upsert per row, the same rule as ours (newer stamp wins).
OLD_UPSERT = f"""
INSERT INTO {SCHEMA}.orders_row_by_row (tenant_id, order_id, change_stamp, creation_date, payload)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (tenant_id, order_id) DO UPDATE
   SET change_stamp = excluded.change_stamp, creation_date = excluded.creation_date,
       payload = excluded.payload, synced_at = now()
 WHERE excluded.change_stamp >= orders_row_by_row.change_stamp
   AND excluded.payload IS DISTINCT FROM orders_row_by_row.payload
"""
COPY_SQL = (
    f"COPY {SCHEMA}.orders_copy (tenant_id, order_id, change_stamp, creation_date, payload)"
    " FROM STDIN"
)

Row = tuple[str, datetime, datetime, str, str]  # key, stamp, creation, summary, payload

PROJECTED_RTT = 0.001  # seconds: a hosted worker and a hosted database, not the same host
# CREATE TEMP TABLE IF NOT EXISTS, COPY, the upsert, TRUNCATE and COMMIT per batch.
OURS_TRIPS_PER_ROW = 5 / BATCH_SIZE


def describe_connection(url: str) -> str:
    """How the client reaches Postgres: the row-by-row cost grows with the round trip."""
    parts = urlsplit(url)
    host = parse_qs(parts.query).get("host", [parts.hostname or ""])[0]
    if not host or host.startswith("/"):
        return f"Unix socket ({host or 'default directory'})"
    return f"TCP {host}:{parts.port or 5432}"


def _spool_documents(bench: Bench, count: int, path: Path) -> int:
    """Write up to `count` well-formed order documents of the sandbox as landing rows."""
    written = 0
    with path.open("wb") as spool:
        for account in bench.tenant_ids:
            for record in bench.sandbox.export(account, "orders"):
                if record["malformed"]:
                    continue
                key, stamp, creation, summary, payload = order_row(
                    record["doc"], orjson.dumps(record["doc"])
                )
                spool.write(
                    orjson.dumps([key, stamp.isoformat(), creation.isoformat(), summary, payload])
                    + b"\n"
                )
                written += 1
                if written == count:
                    return written
    return written


def _rows(path: Path) -> Iterator[Row]:
    with path.open("rb") as spool:
        for line in spool:
            key, stamp, creation, summary, payload = orjson.loads(line)
            yield (
                key,
                datetime.fromisoformat(stamp),
                datetime.fromisoformat(creation),
                summary,
                payload,
            )


def _document(row: Row) -> tuple[str, datetime, datetime, str]:
    """The row without its summary: what the old way and the plain COPY write."""
    key, stamp, creation, _summary, payload = row
    return key, stamp, creation, payload


def _ours(url: str, path: Path) -> None:
    table = RawTable(SCHEMA, TABLES["ours"], "order_id", ORDERS.extra_columns)
    with psycopg.connect(url) as conn:
        land(conn, table, TENANT, _rows(path), "bench", Landing())


def _row_by_row(url: str, path: Path) -> None:
    conn = psycopg2.connect(url)
    try:
        rows = _rows(path)
        with conn.cursor() as cur:
            while batch := list(islice(rows, OLD_BATCH)):
                cur.executemany(OLD_UPSERT, [(TENANT, *_document(row)) for row in batch])
                conn.commit()
    finally:
        conn.close()


def _copy(url: str, path: Path) -> None:
    with psycopg.connect(url) as conn, conn.cursor().copy(COPY_SQL) as copy:
        for row in _rows(path):
            copy.write_row((TENANT, *_document(row)))


def _table_stats(url: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(url) as conn:
        return {
            method: {
                "rows": conn.execute(f"SELECT count(*) FROM {SCHEMA}.{table}").fetchone()[0],
                "table_mb": round(
                    conn.execute(
                        "SELECT pg_total_relation_size(%s::regclass)", (f"{SCHEMA}.{table}",)
                    ).fetchone()[0]
                    / 2**20,
                    1,
                ),
            }
            for method, table in TABLES.items()
        }


def run_write_path(bench: Bench) -> StageResult:
    """Land the scale's number of order documents each way; ratios of ours to the others."""
    with tempfile.TemporaryDirectory(prefix="cdp-bench-write-") as folder:
        path = Path(folder) / "orders.ndjson"
        documents = _spool_documents(bench, bench.scale.write_path_documents, path)
        spool_kib = path.stat().st_size / 1024
        with psycopg.connect(bench.url, autocommit=True) as conn:
            conn.execute(SETUP)
        with stage("write_path", bench.url) as result:
            started = time.perf_counter()
            for _ in _rows(path):
                pass
            input_seconds = time.perf_counter() - started
            seconds: dict[str, float] = {}
            # The limit first, ours second, the slow one last: each starts on a quiet server.
            for method, write in (("copy", _copy), ("ours", _ours), ("row_by_row", _row_by_row)):
                started = time.perf_counter()
                write(bench.url, path)
                seconds[method] = time.perf_counter() - started
                bench.echo(f"  write path {method}: {documents / seconds[method]:,.0f} rows/s")
            tables = _table_stats(bench.url)
    with psycopg.connect(bench.url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    rate = {method: documents / value for method, value in seconds.items()}
    result.records = documents
    result.records_label = "documents"
    result.details = {
        "connection": describe_connection(bench.url),
        "document_kib": round(spool_kib / documents, 2) if documents else 0.0,
        "input_seconds": round(input_seconds, 3),
        "methods": {
            method: {
                "seconds": round(seconds[method], 3),
                "rows_per_second": round(rate[method], 1),
                **tables[method],
            }
            for method in seconds
        },
        "ours_vs_copy": round(rate["ours"] / rate["copy"], 3),
        "ours_vs_row_by_row": round(rate["ours"] / rate["row_by_row"], 3),
        # A model, not a measurement: the same per-row costs plus one round trip per statement
        # (row-by-row: one per row; ours: about five per batch of 2,000).
        "projected_at_1ms_round_trip": {
            "row_by_row_rows_per_second": round(
                1 / (seconds["row_by_row"] / documents + PROJECTED_RTT), 1
            ),
            "ours_rows_per_second": round(
                1 / (seconds["ours"] / documents + OURS_TRIPS_PER_ROW * PROJECTED_RTT), 1
            ),
        },
    }
    return result
