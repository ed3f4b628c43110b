"""VTEX ingestion end to end: sandbox over loopback -> Dagster assets -> Postgres."""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import orjson
import psycopg
import pytest
from click.testing import CliRunner
from support import TABLES, metadata, months_ago, register, store_from_history_start, sync, vtex_for

from cdp_assets.cli import main
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.ops.metrics import collect_history
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, order_months, tenants
from cdp_assets.tenants.registry import vtex_orders_available_from
from cdp_assets.vtex.assets import MONTH_FIGURES, vtex_orders
from cdp_assets.vtex.client import CUSTOMER_FIELDS
from cdp_devkit.sandbox import SandboxProcess, credentials_for

BUSY_DAY = months_ago(18) + timedelta(days=14)
STORES = {
    "alpha": store_from_history_start(
        "alpha",
        seed=1,
        customers=300,
        orders=1500,
        products=60,
        malformed_orders=4,
    ),
    "beta": store_from_history_start("beta", seed=2, customers=200, orders=800, products=40),
    "gamma": store_from_history_start(
        "gamma",
        seed=3,
        customers=150,
        orders=400,
        products=30,
        busy_day=BUSY_DAY,
        busy_day_orders=3200,
    ),
}


@pytest.fixture(scope="module")
def sandbox():
    with SandboxProcess(list(STORES.values())) as server:
        yield server


def load_truth(conn: psycopg.Connection, sandbox: SandboxProcess, account: str, entity: str) -> int:
    """The sandbox's truth for an entity in a temp table `truth` (key, payload); returns
    how many records are malformed there."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS truth (key text PRIMARY KEY, payload jsonb)")
    conn.execute("TRUNCATE truth")
    malformed = 0
    with conn.cursor().copy("COPY truth (key, payload) FROM STDIN") as copy:
        for record in sandbox.export(account, entity):
            if record["malformed"]:
                malformed += 1
                continue
            doc = record["doc"]
            if entity == "customers":  # the sync asks Master Data for these fields only
                doc = {k: v for k, v in doc.items() if k in CUSTOMER_FIELDS.split(",")}
            copy.write_row((str(record["key"]), orjson.dumps(doc).decode()))
    return malformed


def differences(conn: psycopg.Connection, tenant_id: str, entity: str) -> tuple[int, int, int]:
    """(rows in truth, truth rows missing or different in the warehouse, warehouse extras)."""
    key = TABLES[entity][0]
    stored = f"SELECT {key} AS key, payload FROM raw_vtex.{entity} WHERE tenant_id = %(t)s"
    (truth,) = conn.execute("SELECT count(*) FROM truth").fetchone()
    (missing,) = conn.execute(
        f"SELECT count(*) FROM (SELECT key, payload FROM truth EXCEPT {stored}) d", {"t": tenant_id}
    ).fetchone()
    (extra,) = conn.execute(
        f"SELECT count(*) FROM ({stored} EXCEPT SELECT key, payload FROM truth) d", {"t": tenant_id}
    ).fetchone()
    return truth, missing, extra


def assert_equals_truth(conn, sandbox, tenant_id: str, account: str, entity: str) -> None:
    malformed = load_truth(conn, sandbox, account, entity)
    truth, missing, extra = differences(conn, tenant_id, entity)
    assert truth > 0
    assert (missing, extra) == (0, 0), f"{tenant_id}.{entity}: {missing} missing, {extra} extra"
    if entity == "orders":
        (rejected,) = conn.execute(
            "SELECT count(*) FROM raw_vtex.rejects WHERE tenant_id = %s AND entity = 'orders'",
            (tenant_id,),
        ).fetchone()
        assert rejected == malformed


def checksum(conn: psycopg.Connection, tenant_id: str) -> list[tuple]:
    return [
        conn.execute(
            f"SELECT count(*), md5(string_agg(payload::text, '' ORDER BY {key}))"
            f" FROM raw_vtex.{entity} WHERE tenant_id = %s",
            (tenant_id,),
        ).fetchone()
        for entity, (key, _) in TABLES.items()
    ]


def run_figures(result: dg.ExecuteInProcessResult) -> dict[str, float]:
    """A run's figures: the rows of its partitions added up, its requests and time."""
    figures = metadata(result)
    events = result.get_asset_materialization_events()
    for key in MONTH_FIGURES:
        if key in figures:
            figures[key] = sum(event.materialization.metadata[key].value for event in events)
    return figures


def test_full_sync_equals_the_sandbox_and_a_rerun_changes_nothing(conn, instance, sandbox):
    register(conn, "t_alpha", "alpha")
    register(conn, "t_beta", "beta")
    first = sync(instance, sandbox, "t_alpha")
    sync(instance, sandbox, "t_beta")
    for tenant_id, account in (("t_alpha", "alpha"), ("t_beta", "beta")):
        for entity in TABLES:
            assert_equals_truth(conn, sandbox, tenant_id, account, entity)

    orders = run_figures(first["orders"])
    assert orders["rows_rejected"] == STORES["alpha"].malformed_orders
    assert orders["rows_inserted"] + orders["rows_rejected"] == orders["orders_listed"]
    assert orders["api_requests"] > orders["orders_listed"]

    before = checksum(conn, "t_alpha")
    again = sync(instance, sandbox, "t_alpha", full_refresh=True)
    assert checksum(conn, "t_alpha") == before
    for entity in ("orders", "customers"):
        counts = run_figures(again[entity])
        assert counts["rows_inserted"] == counts["rows_updated"] == 0
        assert counts["rows_unchanged"] > 0


def test_malformed_orders_are_quarantined_with_reasons_and_the_rest_lands(conn, instance, sandbox):
    register(conn, "t_alpha", "alpha")
    sync(instance, sandbox, "t_alpha", entities=("orders",))
    rejects = conn.execute(
        "SELECT natural_key, reason, raw_text FROM raw_vtex.rejects"
        " WHERE tenant_id = 't_alpha' AND entity = 'orders'"
    ).fetchall()
    assert len(rejects) == STORES["alpha"].malformed_orders
    assert all(reason and raw for _, reason, raw in rejects)
    reasons = " ".join(reason for _, reason, _ in rejects)
    assert "not valid JSON" in reasons and "lastChange" in reasons
    # Re-running does not pile up copies of the same bad records.
    sync(instance, sandbox, "t_alpha", entities=("orders",), full_refresh=True)
    (count,) = conn.execute(
        "SELECT count(*) FROM raw_vtex.rejects WHERE tenant_id = 't_alpha' AND entity = 'orders'"
    ).fetchone()
    assert count == len(rejects)


def test_changes_in_the_source_are_picked_up_exactly(conn, instance, sandbox):
    register(conn, "t_beta", "beta")
    sync(instance, sandbox, "t_beta", entities=("orders",))
    at = datetime.now(UTC) - timedelta(hours=1)
    changed = sandbox.mutate("beta", seed=5, changed=12, new=7, at=at)
    assert len(changed) == 19

    # The twice-daily sync: the latest months, each resuming from its cursor minus 48 h.
    recent = (
        order_months.get_partition_key_for_timestamp((at - timedelta(days=2)).timestamp()),
        order_months.get_last_partition_key(),
    )
    incremental = run_figures(
        sync(instance, sandbox, "t_beta", entities=("orders",), months=recent)["orders"]
    )
    assert incremental["rows_inserted"] == 7

    # A full re-read of every month finds the remaining status changes and nothing else.
    full = run_figures(
        sync(instance, sandbox, "t_beta", entities=("orders",), full_refresh=True)["orders"]
    )
    assert full["rows_inserted"] == 0
    assert incremental["rows_updated"] + full["rows_updated"] == 12
    assert_equals_truth(conn, sandbox, "t_beta", "beta", "orders")


def test_a_day_with_more_orders_than_one_list_query_returns_syncs_completely(
    conn, instance, sandbox
):
    register(conn, "t_gamma", "gamma")
    month = BUSY_DAY.replace(day=1).isoformat()
    sync(instance, sandbox, "t_gamma", entities=("orders",), months=(month, month))
    (on_busy_day,) = conn.execute(
        "SELECT count(*) FROM raw_vtex.orders WHERE tenant_id = 't_gamma'"
        " AND creation_date >= %s AND creation_date < %s",
        (BUSY_DAY, BUSY_DAY + timedelta(days=1)),
    ).fetchone()
    assert on_busy_day > 3000
    load_truth(conn, sandbox, "gamma", "orders")
    (expected,) = conn.execute(
        "SELECT count(*) FROM truth WHERE (payload->>'creationDate')::timestamptz >= %s"
        " AND (payload->>'creationDate')::timestamptz < %s",
        (BUSY_DAY, BUSY_DAY + timedelta(days=1)),
    ).fetchone()
    assert on_busy_day == expected


def test_sync_converges_through_injected_faults(conn, instance, sandbox):
    register(conn, "t_faulty", "beta")
    sandbox.set_faults(
        {
            "seed": 11,
            "rate_429": 0.08,
            "retry_after": 0,
            "rate_5xx": 0.05,
            "rate_reset": 0.03,
            "rate_truncate": 0.03,
            "rate_slow": 0.01,
            "slow_seconds": 2.0,
            "duplicate_pages": True,
        }
    )
    try:
        results = sync(
            instance,
            sandbox,
            "t_faulty",
            vtex=vtex_for(sandbox, timeout_seconds=0.5, max_retries=10),
        )
    finally:
        sandbox.clear_faults()
    for entity in TABLES:
        assert_equals_truth(conn, sandbox, "t_faulty", "beta", entity)
    orders = run_figures(results["orders"])
    assert orders["api_429_responses"] > 0 and orders["api_retries"] > orders["api_429_responses"]
    # The pace the client kept, which the request budget of the operations metrics is
    # judged against whatever process reads them.
    assert orders["api_requests_per_second"] == 5000
    (sample,) = [
        s
        for s in collect_history(instance, datetime.now(UTC)).api
        if s.run_id == results["orders"].run_id
    ]
    assert sample.requests_per_second == 5000


def test_refused_credentials_fail_that_tenant_only_and_never_leak(
    conn, instance, sandbox, capfd, caplog
):
    register(conn, "t_good", "gamma")
    register(conn, "t_locked", "alpha")
    os.environ["TEST_T_LOCKED_TOKEN"] = "wrong-token-value-123"
    failed = sync(instance, sandbox, "t_locked", entities=("customers",), raise_on_error=False)
    assert not failed["customers"].success
    good = sync(instance, sandbox, "t_good", entities=("customers",))
    assert good["customers"].success
    assert_equals_truth(conn, sandbox, "t_good", "gamma", "customers")

    error = failed["customers"].get_step_failure_events()[0].event_specific_data.error
    assert "VtexAuthError" in error.to_string()
    assert "refused the credentials (HTTP 401)" in error.to_string()
    secrets = ["wrong-token-value-123", *credentials_for("gamma"), *credentials_for("alpha")]
    printed = capfd.readouterr()
    texts = [printed.out, printed.err, caplog.text, error.to_string()]
    for run_id in (failed["customers"].run_id, good["customers"].run_id):
        texts.append(" ".join(str(record) for record in instance.all_logs(run_id)))
    assert "refused the credentials" in printed.err  # the log output was really captured
    for text in texts:
        for secret in secrets:
            assert secret not in text


def test_a_step_still_failing_after_request_retries_is_retried_then_fails(conn, instance, sandbox):
    register(conn, "t_outage", "gamma")
    sandbox.set_faults({"seed": 3, "rate_5xx": 1.0, "routes": ["masterdata"]})
    try:
        outage = vtex_for(sandbox, max_retries=1, step_retry_base_seconds=0.01)
        failed = sync(
            instance,
            sandbox,
            "t_outage",
            vtex=outage,
            entities=("customers",),
            raise_on_error=False,
        )["customers"]
    finally:
        sandbox.clear_faults()
    assert not failed.success
    retries = [e for e in failed.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(retries) == 3  # then the step fails for good
    error = failed.get_step_failure_events()[0].event_specific_data.error
    assert "VtexRequestFailed" in error.to_string()


def test_each_month_of_a_range_run_records_its_own_counts(conn, instance, sandbox):
    register(conn, "t_months", "beta")
    # The history's second to fourth months.
    months = tuple(months_ago(back).isoformat() for back in (21, 20, 19))
    result = sync(
        instance, sandbox, "t_months", entities=("orders",), months=(months[0], months[-1])
    )
    load_truth(conn, sandbox, "beta", "orders")
    truth = dict(
        conn.execute(
            "SELECT to_char(date_trunc('month', (payload->>'creationDate')::timestamptz"
            " AT TIME ZONE 'UTC'), 'YYYY-MM-DD'), count(*) FROM truth GROUP BY 1"
        ).fetchall()
    )
    expected = {month: truth[month] for month in months}
    assert len(set(expected.values())) > 1  # the months differ, so a run total would show

    recorded = {}
    for event in result["orders"].get_asset_materialization_events():
        month = event.partition.split("|")[0]
        figures = {k: v.value for k, v in event.materialization.metadata.items()}
        recorded[month] = figures
    assert {m: f["rows_received"] for m, f in recorded.items()} == expected
    assert {m: f["rows_inserted"] for m, f in recorded.items()} == expected
    assert {m: f["orders_listed"] for m, f in recorded.items()} == expected
    # The VTEX requests and the time are the run's, which the operations metrics read.
    of_the_run = {(f["api_requests"], f["seconds"], f["months"]) for f in recorded.values()}
    assert len(of_the_run) == 1
    ((requests, _, in_run),) = of_the_run
    assert requests > sum(expected.values()) and in_run == 3


def test_a_block_run_syncs_each_tenant_and_one_tenants_failure_spares_the_others(
    conn, instance, sandbox
):
    """The twice-daily schedule's run over neighbouring tenants: each tenant's months land and
    are materialized even when another tenant of the run fails; the run fails naming it, its
    month is recorded failed, and no credential reaches the error."""
    blocked = ("t_blk_a", "t_blk_b", "t_blk_c")
    for tenant_id, account in zip(blocked, ("beta", "alpha", "gamma"), strict=True):
        register(conn, tenant_id, account)
    os.environ["TEST_T_BLK_B_TOKEN"] = "wrong-token-value-456"
    instance.add_dynamic_partitions(tenants.name, list(blocked))
    first, last = (months_ago(back).isoformat() for back in (21, 20))
    result = dg.materialize(
        [vtex_orders],
        resources={"warehouse": WarehouseResource(), "vtex": vtex_for(sandbox)},
        instance=instance,
        raise_on_error=False,
        tags={
            RANGE_START_TAG: f"{first}|t_blk_a",
            RANGE_END_TAG: f"{last}|t_blk_c",
        },
    )
    assert not result.success
    materialized = sorted(e.partition for e in result.get_asset_materialization_events())
    assert materialized == sorted(f"{m}|{t}" for t in ("t_blk_a", "t_blk_c") for m in (first, last))
    landed = dict(
        conn.execute(
            "SELECT tenant_id, count(*) FROM raw_vtex.orders WHERE tenant_id = ANY(%s) GROUP BY 1",
            (list(blocked),),
        ).fetchall()
    )
    for tenant_id, account in (("t_blk_a", "beta"), ("t_blk_c", "gamma")):
        load_truth(conn, sandbox, account, "orders")
        (expected,) = conn.execute(
            "SELECT count(*) FROM truth WHERE (payload->>'creationDate')::timestamptz"
            " >= %s::timestamp AT TIME ZONE 'UTC'"
            " AND (payload->>'creationDate')::timestamptz < %s::timestamp AT TIME ZONE 'UTC'",
            (months_ago(21), months_ago(19)),
        ).fetchone()
        assert landed[tenant_id] == expected > 0
    assert "t_blk_b" not in landed
    states = conn.execute(
        "SELECT tenant_id, state FROM cdp.order_months WHERE tenant_id = ANY(%s)"
        " AND month = %s ORDER BY 1",
        (list(blocked), months_ago(21)),
    ).fetchall()
    assert states == [("t_blk_a", "reconciled"), ("t_blk_b", "failed"), ("t_blk_c", "reconciled")]
    error = result.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert "orders could not be synced for t_blk_b: VtexAuthError" in error
    assert "t_blk_a" not in error and "wrong-token-value-456" not in error
    assert not any(secret in error for secret in credentials_for("alpha"))


def test_a_tenant_added_without_a_history_start_starts_where_vtex_serves_orders(conn):
    """VTEX serves the orders of the last two years: older ones are imported from files."""
    added = CliRunner().invoke(
        main,
        [
            *("tenants", "add", "t_default_start", "--account", "defaultstart"),
            *("--app-key-ref", "DEFAULT_START_KEY", "--app-token-ref", "DEFAULT_START_TOKEN"),
        ],
    )
    assert added.exit_code == 0, added.output
    conn.execute(
        "INSERT INTO cdp.tenants (tenant_id, account_name, app_key_ref, app_token_ref)"
        " VALUES ('t_default_sql', 'defaultsql', 'DEFAULT_SQL_KEY', 'DEFAULT_SQL_TOKEN')"
    )
    starts = conn.execute(
        "SELECT history_start FROM cdp.tenants"
        " WHERE tenant_id IN ('t_default_start', 't_default_sql')"
    ).fetchall()
    expected = vtex_orders_available_from(datetime.now(UTC)).date()
    assert starts == [(expected,), (expected,)]
    assert timedelta(days=727) <= date.today() - expected <= timedelta(days=730)
