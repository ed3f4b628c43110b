"""The VTEX asset checks, run by Dagster for a tenant's partition as a sync's run runs them."""

from datetime import UTC, date, datetime

import dagster as dg
import psycopg
from support import evaluate_check, register

from cdp_assets.lib.sync_state import OrderMonth, record_order_month, set_cursor
from cdp_assets.vtex.checks import orders_reconciled_check, raw_rows_checks

CUSTOMERS_CHECK = next(c for c in raw_rows_checks if "customers" in str(c.check_keys))


def evaluate(instance: dg.DagsterInstance, tenant_id: str) -> dg.AssetCheckEvaluation:
    """The customers check alone, for one tenant's partition."""
    return evaluate_check(instance, CUSTOMERS_CHECK, tenant_id)


def _synced(conn: psycopg.Connection, tenant_id: str) -> None:
    set_cursor(conn, tenant_id, "customers", datetime.now(UTC), "run-1")
    conn.commit()


def test_a_synced_tenant_without_rows_fails_its_own_check_only(conn, instance):
    register(conn, "chk_empty", "chkempty")
    register(conn, "chk_full", "chkfull")
    assert evaluate(instance, "chk_empty").passed  # not synced yet
    _synced(conn, "chk_empty")
    _synced(conn, "chk_full")
    conn.execute(
        "INSERT INTO raw_vtex.customers (tenant_id, customer_id, change_stamp, payload)"
        " VALUES ('chk_full', 'c1', now(), '{}')"
    )
    conn.commit()

    failing = evaluate(instance, "chk_empty")
    assert not failing.passed and failing.partition == "chk_empty"
    assert failing.metadata["tenants_without_rows"].value == "chk_empty"
    # The other tenant's check judges that tenant alone: green beside the empty one.
    other = evaluate(instance, "chk_full")
    assert other.passed and other.partition == "chk_full"
    assert other.metadata["tenants_checked"].value == "chk_full"

    conn.execute(
        "INSERT INTO raw_vtex.customers (tenant_id, customer_id, change_stamp, payload)"
        " VALUES ('chk_empty', 'c1', now(), '{}')"
    )
    conn.commit()
    assert evaluate(instance, "chk_empty").passed


def test_an_order_month_missing_orders_fails_that_tenant_and_month_only(conn, instance):
    register(conn, "chk_orders", "chkorders")
    register(conn, "chk_orders_ok", "chkordersok")
    conn.execute(
        "INSERT INTO raw_vtex.unreadable_orders (tenant_id, order_id, month, error)"
        " VALUES ('chk_orders', '1-01', '2026-03-01', 'GET ... failed (last: HTTP 503)')"
    )
    record_order_month(
        conn, "chk_orders", date(2026, 4, 1), OrderMonth("unreconciled", 21, 16), "run-1"
    )
    conn.commit()

    def passes(tenant_id: str, month: str) -> bool:
        return evaluate_check(instance, orders_reconciled_check, tenant_id, month).passed

    unread = evaluate_check(instance, orders_reconciled_check, "chk_orders", "2026-03-01")
    assert not unread.passed and unread.metadata["orders_unread"].value == 1
    assert "1 order unread in 2026-03" in unread.metadata["gaps"].value
    assert not passes("chk_orders", "2026-04-01")  # VTEX reported 21, 16 accounted for
    assert passes("chk_orders", "2026-05-01") and passes("chk_orders_ok", "2026-03-01")

    conn.execute("DELETE FROM raw_vtex.unreadable_orders WHERE tenant_id = 'chk_orders'")
    record_order_month(conn, "chk_orders", date(2026, 4, 1), OrderMonth("reconciled"), "run-2")
    conn.commit()
    assert passes("chk_orders", "2026-03-01") and passes("chk_orders", "2026-04-01")
