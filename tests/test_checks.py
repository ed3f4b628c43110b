"""The VTEX asset checks, invoked as the UI's "execute checks" would run them."""

from datetime import UTC, datetime

import dagster as dg
from support import register

from cdp_assets.lib.sync_state import set_cursor
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.vtex.checks import raw_rows_checks

CUSTOMERS_CHECK = next(c for c in raw_rows_checks if "customers" in str(c.check_keys))


def evaluate(check: dg.AssetChecksDefinition) -> dg.AssetCheckResult:
    return check(warehouse=WarehouseResource())


def test_a_synced_tenant_without_rows_fails_the_rows_check(conn):
    register(conn, "chk_empty", "chkempty")
    before = evaluate(CUSTOMERS_CHECK)
    assert "chk_empty" not in before.metadata["tenants_without_rows"].value  # not synced yet
    set_cursor(conn, "chk_empty", "customers", datetime.now(UTC), "run-1")
    conn.commit()
    failing = evaluate(CUSTOMERS_CHECK)
    assert not failing.passed
    assert "chk_empty" in failing.metadata["tenants_without_rows"].value
    conn.execute(
        "INSERT INTO raw_vtex.customers (tenant_id, customer_id, change_stamp, payload)"
        " VALUES ('chk_empty', 'c1', now(), '{}')"
    )
    conn.commit()
    assert "chk_empty" not in evaluate(CUSTOMERS_CHECK).metadata["tenants_without_rows"].value
