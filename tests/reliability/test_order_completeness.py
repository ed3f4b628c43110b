"""Orders from a hostile VTEX: whatever one document, one detail call or one list answer does,
the rest of the month lands, nothing is lost without a record saying so (a quarantined
document, an unread order, an unreconciled month), every run ends within a bound, and the
warehouse ends equal to the sandbox's truth once VTEX answers properly again.
"""

from __future__ import annotations

import gzip
import time
from collections import defaultdict
from datetime import UTC, date, datetime

import dagster as dg
import orjson
import psycopg
import pytest
from click.testing import CliRunner
from support import THIS_MONTH, evaluate_check, metadata, register, sync, vtex_for
from truth import Comparison, compare

from cdp_assets.cli import main
from cdp_assets.lib.upsert import upsert_documents
from cdp_assets.ops.status import collect_status, render_text
from cdp_assets.partitions import month_start, tenants
from cdp_assets.tenants.registry import vtex_orders_available_from
from cdp_assets.vtex.checks import orders_reconciled_check
from cdp_assets.vtex.records import order_row
from cdp_assets.vtex.sync import ORDERS
from cdp_devkit.sandbox import SandboxProcess, StoreSpec

# Three whole months of about 16 orders each, inside the two years VTEX serves.
HOSTILE = StoreSpec(
    account="hostile",
    seed=41,
    customers=40,
    orders=48,
    products=6,
    history_start=month_start(THIS_MONTH, 3).date(),
    history_end=THIS_MONTH,
)
MONTHS = [month_start(THIS_MONTH, back).date().isoformat() for back in (3, 2, 1)]
# Three years: the oldest year is older than the two years VTEX serves.
OLDER = StoreSpec(
    account="olderstore",
    seed=43,
    customers=40,
    orders=200,
    products=6,
    history_start=month_start(THIS_MONTH, 36).date(),
    history_end=THIS_MONTH,
)
# Quick retries, and step retries without their production pause: time is not measured here.
CLIENT = {"max_retries": 2, "backoff_cap_seconds": 0.1, "step_retry_base_seconds": 0.01}
# Every run here reads a few hundred orders at most: well under this, or it loops.
RUN_BOUND_SECONDS = 60


@pytest.fixture(scope="module")
def sandbox():
    with SandboxProcess([HOSTILE, OLDER]) as server:
        yield server


@pytest.fixture
def faults(sandbox: SandboxProcess):
    yield sandbox
    sandbox.clear_faults()


def new_tenant(conn: psycopg.Connection, tenant_id: str, spec: StoreSpec = HOSTILE) -> str:
    register(conn, tenant_id, spec.account, history_start=spec.history_start)
    return tenant_id


def report(
    reliability_report,
    scenario: str,
    faults: str,
    comparison: Comparison,
    passed: bool,
    lost: int = 0,
) -> None:
    """The scenario's row: what `comparison` found, plus what the scenario `lost` besides."""
    reliability_report.record(
        f"hostile VTEX: {scenario}",
        faults=faults,
        checked=comparison.checked,
        lost=comparison.lost + lost,
        duplicates=comparison.duplicates,
        passed=passed,
    )


def orders_by_month(sandbox: SandboxProcess, account: str) -> dict[str, list[str]]:
    """The store's order ids per month partition key, in creation order."""
    months: dict[str, list[str]] = defaultdict(list)
    rows = sorted(
        (row["doc"]["creationDate"], row["key"]) for row in sandbox.export(account, "orders")
    )
    for created, key in rows:
        months[created[:7] + "-01"].append(key)
    return months


def run_orders(
    instance, sandbox, tenant_id: str, first: str, last: str, **options
) -> dg.ExecuteInProcessResult:
    """One orders run over months first..last, timed: it must end within the bound."""
    started = time.monotonic()
    result = sync(
        instance,
        sandbox,
        tenant_id,
        vtex=vtex_for(sandbox, **CLIENT),
        entities=("orders",),
        months=(first, last),
        raise_on_error=False,
        **options,
    )["orders"]
    assert time.monotonic() - started < RUN_BOUND_SECONDS
    return result


def month_figures(result: dg.ExecuteInProcessResult) -> dict[str, dict]:
    """Each month's metadata in a run, by month partition key."""
    return {
        event.partition.split("|")[0]: {
            k: v.value for k, v in event.materialization.metadata.items()
        }
        for event in result.get_asset_materialization_events()
    }


def check_passes(instance: dg.DagsterInstance, tenant_id: str, month: str) -> bool:
    """The orders' reconciliation check of one tenant x month partition."""
    return evaluate_check(instance, orders_reconciled_check, tenant_id, month).passed


def orders_status(instance, conn, tenant_id: str):
    """`cdp status`'s verdict on the tenant's orders."""
    instance.add_dynamic_partitions(tenants.name, [tenant_id])
    found = collect_status(
        instance,
        conn,
        tenant_ids=[tenant_id],
        watched={"vtex_orders": (dg.AssetKey("vtex_orders"),)},
        instigators=[],
    )
    (orders,) = found.assets
    return orders, render_text(found)


def unread(conn: psycopg.Connection, tenant_id: str) -> list[tuple]:
    return conn.execute(
        "SELECT order_id, month, error, attempts FROM raw_vtex.unreadable_orders"
        " WHERE tenant_id = %s ORDER BY order_id",
        (tenant_id,),
    ).fetchall()


def rejects(conn: psycopg.Connection, tenant_id: str) -> list[tuple]:
    return conn.execute(
        "SELECT entity, natural_key, reason FROM raw_vtex.rejects WHERE tenant_id = %s"
        " ORDER BY entity, natural_key",
        (tenant_id,),
    ).fetchall()


def month_state(conn: psycopg.Connection, tenant_id: str, month: str) -> str | None:
    row = conn.execute(
        "SELECT state FROM cdp.order_months WHERE tenant_id = %s AND month = %s",
        (tenant_id, month),
    ).fetchone()
    return row and row[0]


def cursor(conn: psycopg.Connection, tenant_id: str, month: str) -> datetime | None:
    row = conn.execute(
        "SELECT synced_through FROM cdp.sync_state"
        " WHERE tenant_id = %s AND entity = 'orders' AND scope = %s",
        (tenant_id, month),
    ).fetchone()
    return row and row[0]


@pytest.mark.timeout(300)
def test_a_value_postgres_refuses_is_quarantined_and_the_rest_lands(
    conn, instance, faults, reliability_report
):
    tenant_id = new_tenant(conn, "hostile_poison")
    month = MONTHS[0]
    poisoned = orders_by_month(faults, HOSTILE.account)[month][3]
    product = next(faults.export(HOSTILE.account, "products"))["key"]
    faults.set_faults({"poison_documents": [poisoned, product]})
    first = run_orders(instance, faults, tenant_id, MONTHS[0], MONTHS[-1])
    products = sync(instance, faults, tenant_id, entities=("products",), raise_on_error=False)[
        "products"
    ]
    quarantined = rejects(conn, tenant_id)
    during = compare(conn, faults, tenant_id, HOSTILE.account, ("orders",))
    faults.clear_faults()
    again = run_orders(instance, faults, tenant_id, MONTHS[0], MONTHS[-1], full_refresh=True)
    sync(instance, faults, tenant_id, entities=("products",))
    after = compare(conn, faults, tenant_id, HOSTILE.account, ("orders", "products"))
    month_orders = len(orders_by_month(faults, HOSTILE.account)[month])
    report(
        reliability_report,
        "a value Postgres refuses (1e-20000) in an order and a product",
        "1 order and 1 product with a number jsonb cannot hold",
        after,
        first.success and products.success and again.success and after.exact,
        lost=max(0, during.lost - 1),
    )
    assert first.success and products.success
    assert [(entity, key) for entity, key, _ in quarantined] == [
        ("orders", poisoned),
        ("products", product),
    ]
    assert all("numeric" in reason for _, _, reason in quarantined)
    figures = month_figures(first)[month]
    assert figures["rows_rejected"] == 1 and figures["rows_inserted"] == month_orders - 1
    assert during.lost == 1  # the poisoned order alone, quarantined with its reason
    assert after.exact, after


@pytest.mark.timeout(300)
def test_an_order_whose_detail_always_fails_is_recorded_unread_and_read_next_run(
    conn, instance, faults, reliability_report
):
    tenant_id = new_tenant(conn, "hostile_unread")
    failing = orders_by_month(faults, HOSTILE.account)[MONTHS[0]][5]
    faults.set_faults({"failing_orders": {failing: "5xx"}})
    first = run_orders(instance, faults, tenant_id, MONTHS[0], MONTHS[-1])
    recorded = unread(conn, tenant_id)
    during = compare(conn, faults, tenant_id, HOSTILE.account, ("orders",))
    first_check = check_passes(instance, tenant_id, MONTHS[0])
    later_check = check_passes(instance, tenant_id, MONTHS[1])
    faults.clear_faults()
    # The next run of that month reads it, though its cursor is past the order.
    again = run_orders(instance, faults, tenant_id, MONTHS[0], MONTHS[0])
    after = compare(conn, faults, tenant_id, HOSTILE.account, ("orders",))
    report(
        reliability_report,
        "an order whose Get order always answers 503",
        "1 order failing on every attempt, in the first of 3 months of a range run",
        after,
        first.success and again.success and after.exact and not unread(conn, tenant_id),
        lost=max(0, during.lost - 1),
    )
    assert first.success  # the month's other orders landed, and the later months too
    ((order_id, month, error, attempts),) = recorded
    assert (order_id, month.isoformat(), attempts) == (failing, MONTHS[0], 1)
    assert "/api/oms/pvt/orders/" in error and "503" in error
    assert during.lost == 1
    assert month_figures(first)[MONTHS[0]]["orders_unread"] == 1
    assert metadata(first)["orders_unread_in_run"] == 1  # the run says so too
    assert not first_check and later_check
    assert again.success and after.exact, after
    assert unread(conn, tenant_id) == [] and check_passes(instance, tenant_id, MONTHS[0])


@pytest.mark.timeout(300)
def test_status_shows_orders_degraded_while_an_older_month_has_unread_orders(
    conn, instance, faults, reliability_report
):
    tenant_id = new_tenant(conn, "hostile_status")
    failing = orders_by_month(faults, HOSTILE.account)[MONTHS[0]][0]
    faults.set_faults({"failing_orders": {failing: "5xx"}})
    run_orders(instance, faults, tenant_id, MONTHS[0], MONTHS[0])
    faults.clear_faults()
    newer = run_orders(instance, faults, tenant_id, MONTHS[-1], MONTHS[-1])  # a newer month
    degraded, text = orders_status(instance, conn, tenant_id)
    run_orders(instance, faults, tenant_id, MONTHS[0], MONTHS[0])
    healed, _ = orders_status(instance, conn, tenant_id)
    report(
        reliability_report,
        "status of a tenant whose older month keeps an order unread",
        "1 order unread in an older month, the newest month synced after it",
        Comparison(1, 0 if degraded.state == "degraded" else 1, 0, 0),
        newer.success and healed.ok,
    )
    assert newer.success
    assert degraded.state == "degraded" and not degraded.ok
    assert f"1 order unread in {MONTHS[0][:7]}" in text
    assert healed.ok and healed.state == "ok"


@pytest.mark.timeout(300)
def test_an_empty_first_answer_never_moves_the_cursor_past_orders(
    conn, instance, faults, reliability_report
):
    tenant_id = new_tenant(conn, "hostile_empty")
    month = MONTHS[1]
    faults.set_faults({"list_answer": "empty_page"})
    first = run_orders(instance, faults, tenant_id, month, month)
    faults.clear_faults()
    second = run_orders(instance, faults, tenant_id, month, month)
    month_orders = orders_by_month(faults, HOSTILE.account)[month]
    landed = conn.execute(
        "SELECT count(*) FROM raw_vtex.orders WHERE tenant_id = %s AND order_id = ANY(%s)",
        (tenant_id, month_orders),
    ).fetchone()[0]
    report(
        reliability_report,
        "a first List orders answering an empty page",
        "1 empty page reporting 0 orders, then the month's orders",
        Comparison(len(month_orders), len(month_orders) - landed, 0, 0),
        first.success and second.success,
    )
    assert first.success and second.success
    assert landed == len(month_orders) > 0


@pytest.mark.timeout(300)
def test_a_far_future_stamp_is_quarantined_and_a_full_refresh_replaces_any_stamp(
    conn, instance, faults, reliability_report
):
    tenant_id = new_tenant(conn, "hostile_future")
    month = MONTHS[2]
    stamped, frozen = orders_by_month(faults, HOSTILE.account)[month][:2]
    faults.set_faults({"future_stamp_orders": [stamped]})
    first = run_orders(instance, faults, tenant_id, MONTHS[0], MONTHS[-1])
    quarantined = rejects(conn, tenant_id)
    faults.clear_faults()
    # A row landed with a far-future stamp before stamps were checked.
    document = next(
        row["doc"] for row in faults.export(HOSTILE.account, "orders") if row["key"] == frozen
    )
    key, _, created, summary, _ = order_row(document, orjson.dumps(document))
    future = {**document, "lastChange": "9999-12-31T23:59:59.9999999+00:00", "status": "stale"}
    stamp = datetime(9999, 12, 31, tzinfo=UTC)
    row = (key, stamp, created, summary, orjson.dumps(future).decode())
    upsert_documents(conn, ORDERS, tenant_id, [row])
    conn.commit()
    again = run_orders(instance, faults, tenant_id, MONTHS[0], MONTHS[-1], full_refresh=True)
    after = compare(conn, faults, tenant_id, HOSTILE.account, ("orders",))
    report(
        reliability_report,
        "an order stamped lastChange 9999-12-31",
        "1 order served with a far-future stamp, 1 row stored with one",
        after,
        first.success and again.success,
    )
    assert first.success
    ((entity, natural_key, reason),) = quarantined
    assert (entity, natural_key) == ("orders", stamped) and "future" in reason
    assert again.success and after.exact, after


@pytest.mark.timeout(300)
def test_a_list_reporting_more_orders_than_it_holds_ends_unreconciled(
    conn, instance, faults, reliability_report
):
    tenant_id = new_tenant(conn, "hostile_total")
    before = faults.stats()["accounts"][HOSTILE.account]["requests"].get("list_orders", 0)
    faults.set_faults({"list_total_excess": 5})
    started = time.monotonic()
    first = run_orders(instance, faults, tenant_id, MONTHS[0], MONTHS[-1])
    seconds = time.monotonic() - started
    lists = faults.stats()["accounts"][HOSTILE.account]["requests"]["list_orders"] - before
    comparison = compare(conn, faults, tenant_id, HOSTILE.account, ("orders",))
    states = {month: month_state(conn, tenant_id, month) for month in MONTHS}
    figures = month_figures(first)
    report(
        reliability_report,
        "List orders always reporting 5 more orders than its pages hold",
        f"paging.total + 5 on every list call; {lists} list calls in {seconds:.1f} s",
        comparison,
        first.success,
    )
    assert first.success and comparison.exact, comparison
    assert lists < 30  # no splitting down to one-second windows
    assert set(states.values()) == {"unreconciled"}
    assert {month: f["orders_unreconciled"] for month, f in figures.items()} == dict.fromkeys(
        MONTHS, 5
    )
    assert all(cursor(conn, tenant_id, month) is None for month in MONTHS)  # re-read next run
    assert not check_passes(instance, tenant_id, MONTHS[0])


@pytest.mark.timeout(300)
def test_malformed_list_answers_fail_clearly_and_a_bad_entry_is_quarantined(
    conn, instance, faults, reliability_report
):
    tenant_id = new_tenant(conn, "hostile_envelope")
    month = MONTHS[0]
    errors = {}
    for name, config in {
        "empty body": {"malformed_envelopes": {"list_orders": "empty_body"}},
        "list is null": {"list_answer": "null_list", "list_answer_calls": 1000},
    }.items():
        faults.set_faults(config)
        failed = run_orders(instance, faults, tenant_id, month, month)
        assert not failed.success
        errors[name] = failed.get_step_failure_events()[0].event_specific_data.error.to_string()
    unlisted = orders_by_month(faults, HOSTILE.account)[month][2]
    faults.set_faults({"unlisted_order_ids": [unlisted]})
    entry = run_orders(instance, faults, tenant_id, month, month)
    quarantined = rejects(conn, tenant_id)
    faults.set_faults({"malformed_envelopes": {"get_order": "empty_body"}})
    empty_details = run_orders(instance, faults, tenant_id, MONTHS[1], MONTHS[1])
    unread_details = unread(conn, tenant_id)
    faults.clear_faults()
    run_orders(instance, faults, tenant_id, MONTHS[0], MONTHS[-1], full_refresh=True)
    after = compare(conn, faults, tenant_id, HOSTILE.account, ("orders",))
    report(
        reliability_report,
        "malformed List and Get order envelopes",
        "empty List body, list: null, 1 entry without orderId, empty Get bodies",
        after,
        entry.success and empty_details.success,
    )
    for name, message in errors.items():
        assert tenant_id in message and "List orders" in message, message
        assert "/api/oms/pvt/orders" in message and name in message, message
    assert entry.success
    ((entity, natural_key, reason),) = quarantined
    assert entity == "orders" and natural_key is None and "orderId" in reason
    assert empty_details.success and unread_details
    assert all("empty body" in error for _, _, error, _ in unread_details)
    assert after.exact and not unread(conn, tenant_id), after


@pytest.mark.timeout(300)
def test_months_older_than_two_years_are_unavailable_and_imported_from_files(
    conn, instance, faults, reliability_report, tmp_path
):
    tenant_id = new_tenant(conn, "hostile_older", OLDER)
    first_month = OLDER.history_start.isoformat()
    result = run_orders(instance, faults, tenant_id, first_month, MONTHS[-1])
    available_from = vtex_orders_available_from(datetime.now(UTC))
    by_month = month_figures(result)
    old_months = [m for m in by_month if date.fromisoformat(m) < month_start(available_from).date()]
    documents = [row["doc"] for row in faults.export(OLDER.account, "orders")]
    older = [d for d in documents if datetime.fromisoformat(d["creationDate"]) < available_from]
    stored = conn.execute(
        "SELECT count(*) FROM raw_vtex.orders WHERE tenant_id = %s", (tenant_id,)
    ).fetchone()[0]
    status, text = orders_status(instance, conn, tenant_id)
    states = {month: month_state(conn, tenant_id, month) for month in old_months}
    cursors = [cursor(conn, tenant_id, month) for month in old_months]

    path = tmp_path / "older-orders.ndjson.gz"
    with gzip.open(path, "wb") as file:
        file.writelines(orjson.dumps(document) + b"\n" for document in older)
    runner = CliRunner()
    imported = runner.invoke(main, ["tenants", "import-orders", tenant_id, str(path)])
    complete = compare(conn, faults, tenant_id, OLDER.account, ("orders",))
    checksum = "SELECT md5(string_agg(payload::text, '' ORDER BY order_id)) FROM raw_vtex.orders"
    before = conn.execute(checksum + " WHERE tenant_id = %s", (tenant_id,)).fetchone()
    again = runner.invoke(main, ["tenants", "import-orders", tenant_id, str(path)])
    after = conn.execute(checksum + " WHERE tenant_id = %s", (tenant_id,)).fetchone()
    report(
        reliability_report,
        "orders older than the two years VTEX serves",
        f"{len(old_months)} months unavailable from VTEX; {len(older)} orders imported",
        complete,
        result.success and imported.exit_code == 0 and complete.exact and before == after,
    )
    assert result.success and old_months and older
    assert {by_month[month]["orders_sync"] for month in old_months} == {"unavailable from VTEX"}
    assert set(states.values()) == {"unavailable"} and cursors == [None] * len(old_months)
    assert stored == len(documents) - len(older)  # everything VTEX serves landed
    assert "unavailable from VTEX" in text and status.ok
    assert imported.exit_code == 0, imported.output
    assert f"{len(older)} inserted" in imported.output
    assert complete.exact, complete
    assert again.exit_code == 0 and "0 inserted, 0 updated" in again.output
    assert before == after
    imported_months = {month_state(conn, tenant_id, month) for month in old_months}
    assert imported_months <= {"imported", "unavailable"} and "imported" in imported_months
