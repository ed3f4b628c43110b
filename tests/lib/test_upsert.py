from datetime import UTC, datetime, timedelta

import orjson
import psycopg
import pytest
from support import order_row

from cdp_assets.lib.rejects import Reject, record_rejects
from cdp_assets.lib.upsert import upsert_documents
from cdp_assets.vtex.sync import BATCH_SIZE, ORDERS, Landing, land

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


def order(order_id: str, stamp: datetime, status: str) -> tuple:
    return order_row(order_id, stamp, status, T0)


def as_json(doc: dict) -> str:
    return orjson.dumps(doc).decode()


def stored(conn, tenant: str) -> dict[str, str]:
    """Each order's status, checking that its summary moved with its document."""
    rows = conn.execute(
        "SELECT order_id, payload->>'status', summary->>'status' FROM raw_vtex.orders"
        " WHERE tenant_id = %s",
        (tenant,),
    ).fetchall()
    assert [summary for _, _, summary in rows] == [status for _, status, _ in rows]
    return {order_id: status for order_id, status, _ in rows}


def test_upsert_inserts_updates_and_ignores_stale_or_identical(conn):
    tenant = "upsert_a"
    first = upsert_documents(
        conn, ORDERS, tenant, [order("1-01", T0, "handling"), order("2-01", T0, "handling")]
    )
    assert (first.inserted, first.updated, first.unchanged) == (2, 0, 0)

    again = upsert_documents(conn, ORDERS, tenant, [order("1-01", T0, "handling")])
    assert (again.inserted, again.updated, again.unchanged) == (0, 0, 1)

    later = T0 + timedelta(hours=1)
    newer = upsert_documents(
        conn,
        ORDERS,
        tenant,
        [order("1-01", later, "invoiced"), order("2-01", T0 - timedelta(hours=1), "canceled")],
    )
    # The newer change wins; the stale one (an out-of-order delivery) is ignored.
    assert (newer.inserted, newer.updated, newer.unchanged) == (0, 1, 1)
    assert stored(conn, tenant) == {"1-01": "invoiced", "2-01": "handling"}


def test_a_key_repeated_in_one_batch_keeps_its_newest_version(conn):
    tenant = "upsert_b"
    batch = [
        order("9-01", T0 + timedelta(minutes=5), "invoiced"),
        order("9-01", T0, "handling"),
    ]
    counts = upsert_documents(conn, ORDERS, tenant, batch)
    assert (counts.inserted, counts.updated, counts.unchanged) == (1, 0, 1)
    assert stored(conn, tenant) == {"9-01": "invoiced"}


def test_tenants_do_not_share_rows(conn):
    upsert_documents(conn, ORDERS, "upsert_c", [order("5-01", T0, "handling")])
    upsert_documents(conn, ORDERS, "upsert_d", [order("5-01", T0, "canceled")])
    assert stored(conn, "upsert_c") == {"5-01": "handling"}
    assert stored(conn, "upsert_d") == {"5-01": "canceled"}


def test_the_same_reject_seen_twice_is_one_row_counted_twice(conn):
    bad = Reject("7-01", "value must be an integer", '{"orderId": "7-01", "value": "x"}')
    other = Reject(None, "not JSON", "{")
    record_rejects(conn, "upsert_e", "orders", [bad, other], run_id="r1")
    record_rejects(conn, "upsert_e", "orders", [bad], run_id="r2")
    rows = conn.execute(
        "SELECT natural_key, reason, times_seen, run_id FROM raw_vtex.rejects"
        " WHERE tenant_id = 'upsert_e' ORDER BY natural_key NULLS LAST"
    ).fetchall()
    assert rows == [("7-01", "value must be an integer", 2, "r2"), (None, "not JSON", 1, "r1")]


def test_each_landed_batch_is_durable_even_inside_an_open_transaction(conn, warehouse_url):
    tenant = "upsert_durable"
    conn.execute("SELECT 1")  # the caller already has a transaction open, as assets do

    def records():
        for i in range(BATCH_SIZE):
            yield order(f"d-{i}", T0, "handling")
        raise RuntimeError("the API failed after one full batch")

    with pytest.raises(RuntimeError):
        land(conn, ORDERS, tenant, records(), "run-1", Landing())
    with psycopg.connect(warehouse_url) as other:
        assert len(stored(other, tenant)) == BATCH_SIZE


def test_a_row_lands_stamped_after_its_document_was_read_not_when_the_transaction_began(conn):
    # A feed drain opens its transaction with a query, then reads orders from VTEX: a change
    # made in between is in the documents, so their landing must not be dated before it.
    tenant = "upsert_landed_at"
    land(conn, ORDERS, tenant, [order("l-01", T0, "handling")], "run-1", Landing())
    (transaction_began,) = conn.execute("SELECT now()").fetchone()
    (read_at,) = conn.execute("SELECT clock_timestamp() + interval '10 milliseconds'").fetchone()
    while conn.execute("SELECT clock_timestamp() <= %s", (read_at,)).fetchone()[0]:
        pass
    changed = [order("l-01", T0 + timedelta(hours=1), "invoiced"), order("l-02", T0, "handling")]
    land(conn, ORDERS, tenant, changed, "run-1", Landing())
    landed = conn.execute(
        "SELECT order_id, synced_at > %s FROM raw_vtex.orders WHERE tenant_id = %s",
        (read_at, tenant),
    ).fetchall()
    assert read_at > transaction_began
    assert sorted(landed) == [("l-01", True), ("l-02", True)]


def test_landed_documents_keep_the_raw_tables_compression(conn):
    """Raw documents are LZ4-compressed where the server has LZ4 (migration 0008)."""
    (lz4_available,) = conn.execute(
        "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
    ).fetchone()
    big = {"orderId": "big-01", "items": [{"id": str(i), "name": f"item {i}"} for i in range(400)]}
    upsert_documents(conn, ORDERS, "upsert_lz4", [("big-01", T0, T0, None, as_json(big))])
    (compression,) = conn.execute(
        "SELECT pg_column_compression(payload) FROM raw_vtex.orders"
        " WHERE tenant_id = 'upsert_lz4' AND order_id = 'big-01'"
    ).fetchone()
    assert compression == ("lz4" if lz4_available else "pglz")


def test_rows_the_warehouse_refuses_are_quarantined_alone_and_the_batch_lands(conn):
    """A number jsonb cannot hold fails the COPY of the whole batch: the batch is landed again
    in halves until each refused row is alone, and those are quarantined with the reason."""
    tenant = "upsert_poison"
    rows = [order(f"p-{i}", T0, "handling") for i in range(BATCH_SIZE)]
    for position in (7, 1234):
        key, stamp, created, summary, _ = rows[position]
        rows[position] = (key, stamp, created, summary, '{"discount": 1e-20000}')
    landing = Landing()
    land(conn, ORDERS, tenant, rows, "run-poison", landing)
    assert (landing.counts.inserted, landing.rejected) == (BATCH_SIZE - 2, 2)
    assert len(stored(conn, tenant)) == BATCH_SIZE - 2
    rejects = conn.execute(
        "SELECT natural_key, reason, raw_text FROM raw_vtex.rejects WHERE tenant_id = %s"
        " ORDER BY natural_key",
        (tenant,),
    ).fetchall()
    assert [key for key, _, _ in rejects] == ["p-1234", "p-7"]
    assert all("numeric" in reason and "1e-20000" in raw for _, reason, raw in rejects)


def test_a_full_refresh_replaces_a_row_whatever_its_stamp(conn):
    tenant = "upsert_replace"
    future = datetime(9999, 12, 31, tzinfo=UTC)
    upsert_documents(conn, ORDERS, tenant, [order("f-01", future, "frozen")])
    corrected = [order("f-01", T0, "invoiced")]
    kept = upsert_documents(conn, ORDERS, tenant, corrected)
    assert kept.updated == 0 and stored(conn, tenant) == {"f-01": "frozen"}
    replaced = upsert_documents(conn, ORDERS, tenant, corrected, replace=True)
    assert replaced.updated == 1 and stored(conn, tenant) == {"f-01": "invoiced"}
