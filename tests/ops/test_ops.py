"""Failed runs in cdp.sync_errors (and alerts), and `cdp status`, on the session's Postgres-backed
Dagster instance: real failed runs, evaluated by the real sensor."""

from __future__ import annotations

import json
import logging
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dagster as dg
import psycopg
import pytest
from click.testing import CliRunner
from support import daemon_alive

from cdp_assets.cli import main
from cdp_assets.lib.redaction import redact
from cdp_assets.lib.sync_state import OrderMonth, record_order_month
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.ops.freshness import FRESHNESS
from cdp_assets.ops.sensors import sync_errors_sensor
from cdp_assets.ops.status import collect_status, render_text, status_json, watched_assets
from cdp_assets.ops.sync_errors import (
    MAX_MESSAGE,
    SyncError,
    failed_partitions,
    latest_errors,
    per_tenant,
    sync_error_from_run,
    tenant_from_tags,
)
from cdp_assets.ops.webhook import UI_URL_ENV, WEBHOOK_ENV, alert_payload, post_alert
from cdp_assets.partitions import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    tenant_month_range_tags,
    tenant_months,
    tenants,
)
from cdp_assets.tenants.registry import Tenant, add_tenant, set_active

TOKEN_VAR, TOKEN = "OPS_TEST_APP_TOKEN", "tok-3f9a7c1e55d2"
# What the failing asset raises: a credential from the environment and a password in a URL.
RAISED = f"401 from VTEX with app token {TOKEN}; warehouse postgresql://cdp:hunter22@db:5432/cdp"
REDACTED = "401 from VTEX with app token ***; warehouse postgresql://cdp:***@db:5432/cdp"


class SyncBrokeError(RuntimeError):
    pass


# Named like the platform's assets: the event log (and so `cdp status`) knows assets by key.
@dg.asset(name="vtex_skus", partitions_def=tenants)
def failing_skus() -> None:
    raise SyncBrokeError(RAISED)


@dg.asset(name="vtex_orders", partitions_def=tenant_months)
def failing_orders() -> None:
    raise SyncBrokeError("orders listing failed: " + "x" * 2000)


@dg.asset(name="vtex_skus", partitions_def=tenants)
def skus_of_the_first_tenant_only(context) -> Iterator:
    """A run over a block of tenants that lands the first and fails for the others."""
    yield dg.AssetMaterialization(context.asset_key, partition=context.partition_keys[0])
    raise SyncBrokeError(RAISED)


@dg.asset(name="vtex_products", partitions_def=tenants)
def working_products() -> dg.MaterializeResult:
    return dg.MaterializeResult()


@pytest.fixture
def tenant(warehouse_url: str, instance: dg.DagsterInstance) -> Iterator[str]:
    """A new active tenant with its partition, never synced; deactivated afterwards so other
    tests of the session do not meet it."""
    tenant_id = f"ops_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(warehouse_url) as conn:
        add_tenant(conn, Tenant(tenant_id, "opsshop", "OPS_KEY", "OPS_TOKEN"))
    instance.add_dynamic_partitions(tenants.name, [tenant_id])
    yield tenant_id
    instance.delete_dynamic_partition(tenants.name, tenant_id)
    with psycopg.connect(warehouse_url) as conn:
        set_active(conn, tenant_id, False)


@pytest.fixture
def neighbours(warehouse_url: str, instance: dg.DagsterInstance) -> Iterator[list[str]]:
    """Three new active tenants whose partitions are neighbours (a block a run covers)."""
    prefix = f"ops_{uuid.uuid4().hex[:8]}"
    block = [f"{prefix}_{i}" for i in range(3)]
    with psycopg.connect(warehouse_url) as conn:
        for tenant_id in block:
            add_tenant(conn, Tenant(tenant_id, "opsshop", "OPS_KEY", "OPS_TOKEN"))
    instance.add_dynamic_partitions(tenants.name, block)
    yield block
    for tenant_id in block:
        instance.delete_dynamic_partition(tenants.name, tenant_id)
    with psycopg.connect(warehouse_url) as conn:
        for tenant_id in block:
            set_active(conn, tenant_id, False)


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_VAR, TOKEN)
    monkeypatch.delenv(WEBHOOK_ENV, raising=False)


@pytest.fixture
def webhook() -> Iterator[tuple[str, list]]:
    """A Slack-like webhook on loopback: (its URL, the (content type, JSON) it received)."""
    received: list = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.headers["Content-Type"], json.loads(body)))
            self.send_response(500 if self.path.endswith("/broken") else 200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/services/T0/B0/secretpart", received
    server.shutdown()
    server.server_close()


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/services/T0/B0/secretpart"


def _fail(instance: dg.DagsterInstance, *assets: dg.AssetsDefinition, **kwargs):
    result = dg.materialize(assets, instance=instance, raise_on_error=False, **kwargs)
    assert not result.success
    return result


def _evaluate_sensor(instance: dg.DagsterInstance, result, warehouse_url: str) -> None:
    context = dg.build_run_status_sensor_context(
        sensor_name=sync_errors_sensor.name,
        dagster_instance=instance,
        dagster_run=result.dagster_run,
        dagster_event=result.get_run_failure_event(),
        resources={"warehouse": WarehouseResource(url=warehouse_url)},
    )
    sync_errors_sensor(context)


def _rows(conn: psycopg.Connection, run_id: str) -> list[tuple]:
    return conn.execute(
        "SELECT tenant_id, job_name, asset_keys, partition_key, error_type, message, step_key"
        " FROM cdp.sync_errors WHERE run_id = %s",
        (run_id,),
    ).fetchall()


def _materialized(instance: dg.DagsterInstance, key: str, partition: str) -> None:
    instance.report_runless_asset_event(dg.AssetMaterialization(key, partition=partition))


def test_a_failed_run_is_recorded_once_with_its_tenant_and_a_redacted_error(
    instance, conn, warehouse_url, tenant, secret_env
):
    result = _fail(instance, failing_skus, partition_key=tenant)
    run_id = result.dagster_run.run_id

    _evaluate_sensor(instance, result, warehouse_url)
    _evaluate_sensor(instance, result, warehouse_url)  # a second look at the same run

    assert _rows(conn, run_id) == [
        (
            tenant,
            "__ephemeral_asset_job__",
            ["vtex_skus"],
            tenant,
            "SyncBrokeError",  # the asset's error, not Dagster's wrapper around it
            REDACTED,
            "vtex_skus",
        )
    ]
    occurred_at = conn.execute(
        "SELECT occurred_at FROM cdp.sync_errors WHERE run_id = %s", (run_id,)
    ).fetchone()[0]
    assert abs(datetime.now(UTC) - occurred_at) < timedelta(minutes=1)


def test_a_range_run_over_one_tenants_months_gives_that_tenant_and_a_truncated_message(
    instance, tenant
):
    result = _fail(
        instance, failing_orders, tags=tenant_month_range_tags(tenant, "2025-01-01", "2025-02-01")
    )
    run = result.dagster_run
    error = sync_error_from_run(
        run,
        result.get_run_failure_event(),
        failed_partitions(instance, run.run_id),
        datetime.now(UTC),
    )
    assert error.tenant_id == tenant
    assert error.partition_key == f"2025-01-01|{tenant}..2025-02-01|{tenant}"
    assert error.asset_keys == ("vtex_orders",)
    assert error.error_type == "SyncBrokeError"
    assert len(error.message) == MAX_MESSAGE
    assert error.message.startswith("orders listing failed: xxx") and error.message.endswith("…")


def test_only_the_assets_a_run_left_unmaterialized_are_blamed(instance, tenant):
    result = _fail(instance, working_products, failing_skus, partition_key=tenant)
    assert failed_partitions(instance, result.dagster_run.run_id) == {"vtex_skus": {tenant}}


@pytest.mark.parametrize(
    ("tags", "expected"),
    [
        ({"dagster/partition": "acme"}, "acme"),
        ({"dagster/partition": "2025-01-01|acme", "dagster/partition/tenant": "acme"}, "acme"),
        ({"dagster/partition": "2025-01-01|acme"}, "acme"),
        (tenant_month_range_tags("acme", "2025-01-01", "2025-06-01"), "acme"),
        ({"dagster/partition": "2025-01-01"}, None),  # a month alone names no tenant
        (  # one range across tenants: no single tenant to blame
            {
                "dagster/asset_partition_range_start": "acme",
                "dagster/asset_partition_range_end": "beta",
            },
            None,
        ),
        ({}, None),
    ],
)
def test_tenant_from_tags(tags, expected):
    assert tenant_from_tags(tags) == expected


def test_redact_masks_credentials_but_keeps_the_rest():
    text = (
        "GET https://api.example.com/x?access_token=EAAB123&limit=5 failed;"
        " headers {'X-VTEX-API-AppToken': 'abc123'}; Authorization: Bearer ya29.zzz;"
        " value s3cr3t-value-42 for partition 2025-01-01|acme"
    )
    assert redact(text, {"META_ACME_TOKEN": "s3cr3t-value-42", "HOME": "/root"}) == (
        "GET https://api.example.com/x?access_token=***&limit=5 failed;"
        " headers {'X-VTEX-API-AppToken': '***'}; Authorization: Bearer ***;"
        " value *** for partition 2025-01-01|acme"
    )


def test_the_sensor_posts_each_failure_once_to_the_webhook(
    instance, conn, warehouse_url, tenant, secret_env, webhook, monkeypatch
):
    url, received = webhook
    monkeypatch.setenv(WEBHOOK_ENV, url)
    monkeypatch.setenv(UI_URL_ENV, "https://dagster.example.com/")
    result = _fail(instance, failing_skus, partition_key=tenant)
    run_id = result.dagster_run.run_id

    _evaluate_sensor(instance, result, warehouse_url)
    _evaluate_sensor(instance, result, warehouse_url)  # already recorded: no second alert

    assert received == [
        (
            "application/json",
            {
                "text": f"cdp run failed: tenant {tenant}; vtex_skus; partition {tenant}\n"
                f"SyncBrokeError: {REDACTED}\n"
                f"job __ephemeral_asset_job__, step vtex_skus,"
                f" https://dagster.example.com/runs/{run_id}"
            },
        )
    ]
    assert TOKEN not in json.dumps(received) and "hunter22" not in json.dumps(received)


def test_a_block_run_is_recorded_for_each_tenant_it_failed_for(
    instance, conn, warehouse_url, neighbours, secret_env, webhook, monkeypatch
):
    """A run over three neighbouring tenants lands the first and fails for the other two: a
    row for each of those two (their latest error is their own in `cdp status`), none for the
    first, and one alert naming both."""
    url, received = webhook
    monkeypatch.setenv(WEBHOOK_ENV, url)
    first, *failed = neighbours
    span = {RANGE_START_TAG: first, RANGE_END_TAG: failed[-1]}
    result = _fail(instance, skus_of_the_first_tenant_only, tags=span)
    run_id = result.dagster_run.run_id

    _evaluate_sensor(instance, result, warehouse_url)
    _evaluate_sensor(instance, result, warehouse_url)  # already recorded: no second row or alert

    job = "__ephemeral_asset_job__"
    partition = f"{first}..{failed[-1]}"
    assert sorted(_rows(conn, run_id)) == [
        (tenant_id, job, ["vtex_skus"], partition, "SyncBrokeError", REDACTED, "vtex_skus")
        for tenant_id in failed
    ]
    assert set(latest_errors(conn, neighbours, ["vtex_skus"])) == {
        (tenant_id, "vtex_skus") for tenant_id in failed
    }
    assert [text["text"].splitlines()[0] for _, text in received] == [
        f"cdp run failed: tenants {failed[0]}, {failed[1]}; vtex_skus; partition {partition}"
    ]


def test_a_block_runs_rows_are_its_tenants_and_keep_the_assets_of_none():
    run = SyncError("r1", "job", None, ("a",), "acme..beta", "E", "m", None, datetime.now(UTC))
    failed = {
        "vtex_skus": {"acme", "beta"},
        "vtex_orders": {"2025-01-01|acme"},
        "audience_catalog": {None},
    }
    rows = per_tenant(run, failed)
    assert [(row.tenant_id, row.asset_keys) for row in rows] == [
        ("acme", ("vtex_orders", "vtex_skus")),
        ("beta", ("vtex_skus",)),
        (None, ("audience_catalog",)),
    ]
    assert {row.message for row in rows} == {"m"}
    # No tenant's partition left unmaterialized, or a run for one tenant: its one row.
    assert per_tenant(run, {"audience_catalog": {None}}) == [run]
    one = replace(run, tenant_id="acme")
    assert per_tenant(one, failed) == [one]


def test_a_webhook_that_is_down_or_refuses_never_fails_the_sensor(
    instance, conn, warehouse_url, tenant, secret_env, webhook, monkeypatch, caplog
):
    monkeypatch.setenv(WEBHOOK_ENV, _closed_port_url())
    result = _fail(instance, failing_skus, partition_key=tenant)
    _evaluate_sensor(instance, result, warehouse_url)  # must not raise
    assert len(_rows(conn, result.dagster_run.run_id)) == 1  # recorded all the same

    url, _ = webhook
    payload = alert_payload(
        [
            sync_error_from_run(
                result.dagster_run, result.get_run_failure_event(), ["vtex_skus"], datetime.now(UTC)
            )
        ]
    )
    log = logging.getLogger("test_ops")
    with caplog.at_level(logging.WARNING, logger="test_ops"):
        assert post_alert(_closed_port_url(), payload, log) is False
        assert post_alert(url.replace("secretpart", "broken"), payload, log) is False
        assert post_alert(url, payload, log) is True
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "alert webhook not reached (ConnectionError)",
        "alert webhook not reached (HTTPError, HTTP 500)",
    ]


def test_status_follows_materializations_and_failures(instance, conn, warehouse_url, tenant):
    watched = {
        "vtex_skus": (dg.AssetKey("vtex_skus"),),
        "vtex_orders": (dg.AssetKey("vtex_orders"),),
        "dbt_tenant_models": (dg.AssetKey("customers"), dg.AssetKey("rfm_segments")),
    }

    def status(now: datetime | None = None) -> dict:
        found = collect_status(instance, conn, tenant_ids=[tenant], watched=watched, now=now)
        return {a.asset: a for a in found.assets}

    never = status()
    assert {a.state for a in never.values()} == {"never"}
    assert all(a.stale and a.last_success is None for a in never.values())

    _materialized(instance, "vtex_skus", tenant)
    # The latest month counts, whatever order the months were synced in.
    _materialized(instance, "vtex_orders", f"2025-02-01|{tenant}")
    _materialized(instance, "vtex_orders", f"2025-01-01|{tenant}")
    _materialized(instance, "customers", tenant)
    half_group = status()
    assert half_group["dbt_tenant_models"].state == "never"  # rfm_segments still missing
    _materialized(instance, "rfm_segments", tenant)

    fresh = status()
    assert {a.state for a in fresh.values()} == {"ok"}
    assert fresh["vtex_orders"].partition_key == f"2025-02-01|{tenant}"
    assert datetime.now(UTC) - fresh["vtex_skus"].last_success < timedelta(minutes=1)
    later = status(datetime.now(UTC) + timedelta(hours=14))  # past orders 13 h, not 26 h
    assert later["vtex_orders"].state == "stale" and later["vtex_skus"].state == "ok"

    # An older month failing (a backfill) does not make the tenant's orders unhealthy...
    _fail(instance, failing_orders, partition_key=f"2024-12-01|{tenant}")
    assert status()["vtex_orders"].state == "ok"
    # ...a newer one does.
    _fail(instance, failing_orders, partition_key=f"2025-03-01|{tenant}")
    assert status()["vtex_orders"].state == "failed"

    failed = _fail(instance, failing_skus, partition_key=tenant)
    _evaluate_sensor(instance, failed, warehouse_url)
    skus = status()["vtex_skus"]
    assert skus.state == "failed" and skus.failed_run_id == failed.dagster_run.run_id
    assert skus.last_error.run_id == failed.dagster_run.run_id
    assert skus.last_error.error_type == "SyncBrokeError"

    _materialized(instance, "vtex_skus", tenant)  # a later success clears the failure
    recovered = status()["vtex_skus"]
    assert recovered.state == "ok" and recovered.failed_run_id is None
    assert recovered.last_error.run_id == failed.dagster_run.run_id  # still the last error


def test_status_shows_orders_degraded_while_any_month_misses_orders(instance, conn, tenant):
    """Judged by the warehouse, not by the latest month: an unread order or a failed month
    further back keeps the tenant's orders degraded; months VTEX no longer serves are named."""
    watched = {"vtex_orders": (dg.AssetKey("vtex_orders"),)}

    def orders() -> tuple:
        found = collect_status(instance, conn, tenant_ids=[tenant], watched=watched, instigators=[])
        (asset,) = found.assets
        return asset, render_text(found), status_json(found)

    _materialized(instance, "vtex_orders", f"2026-11-01|{tenant}")
    conn.execute(
        "INSERT INTO raw_vtex.unreadable_orders (tenant_id, order_id, month, error)"
        " VALUES (%s, '1-01', '2026-03-01', 'GET ... failed (last: HTTP 503)')",
        (tenant,),
    )
    record_order_month(conn, tenant, date(2026, 4, 1), OrderMonth("failed"), "run-1")
    record_order_month(conn, tenant, date(2024, 1, 1), OrderMonth("unavailable"), "run-1")
    conn.commit()
    asset, text, as_json = orders()
    assert asset.state == "degraded" and not asset.ok
    assert f"{tenant} vtex_orders: degraded: 1 order unread in 2026-03; 2026-04 failed" in text
    assert "1 order month (2024-01) unavailable from VTEX" in text
    (problem,) = [p for p in as_json["problems"] if p["tenant_id"] == tenant]
    assert problem["subject"] == "vtex_orders" and "2026-03" in problem["detail"]

    conn.execute("DELETE FROM raw_vtex.unreadable_orders WHERE tenant_id = %s", (tenant,))
    record_order_month(conn, tenant, date(2026, 4, 1), OrderMonth("reconciled"), "run-2")
    conn.commit()
    asset, text, _ = orders()
    assert asset.ok and asset.state == "ok" and "unavailable from VTEX" in text


def test_status_counts_runs_in_progress(instance, conn, tenant):
    watched = {"vtex_skus": (dg.AssetKey("vtex_skus"),)}

    def runs() -> tuple[int, int]:
        found = collect_status(instance, conn, tenant_ids=[tenant], watched=watched)
        return found.queued_runs, found.in_progress_runs

    before = runs()
    # (A queued run needs a code location origin; a started one shows the same counting.)
    started = instance.add_run(
        dg.DagsterRun(job_name="ops_probe", status=dg.DagsterRunStatus.STARTED)
    )
    try:
        after = runs()
    finally:
        instance.delete_run(started.run_id)
    assert after == (before[0], before[1] + 1)


def test_status_shows_the_destination_syncs_still_running_and_their_age(instance, conn, tenant):
    conn.execute(
        "INSERT INTO cdp.activation_runs (destination_id, audience, tenant_id, platform,"
        " dagster_run_id, mode, dry_run, status, started_at) VALUES (%s, 'audience_rfm_champions',"
        " %s, 'meta', 'run-9f1', 'diff', false, 'running', now() - interval '2 hours 5 minutes')",
        (f"{tenant}_meta", tenant),
    )
    conn.commit()
    watched = {"vtex_skus": (dg.AssetKey("vtex_skus"),)}
    found = collect_status(instance, conn, tenant_ids=[tenant], watched=watched)
    text = render_text(found)
    assert (
        f"destination syncs running: 1, the oldest for 2h5m ({tenant}_meta/audience_rfm_champions,"
        " run run-9f1)" in text
    )
    (running,) = status_json(found)["destination_syncs_running"]
    assert running["dagster_run_id"] == "run-9f1" and running["age_seconds"] >= 7500


def test_every_tenant_partitioned_asset_has_a_freshness_expectation():
    from cdp_assets.definitions import defs

    partitioned = {
        a.node_def.name
        for a in defs.assets
        if isinstance(a, dg.AssetsDefinition)
        and a.is_executable
        and a.partitions_def in (tenants, tenant_months)
    }
    # The orders feed is drained only for tenants that turned it on (`cdp tenants feed`);
    # vtex_orders stands for every tenant's orders.
    opt_in = {"vtex_orders_feed"}
    assert partitioned - opt_in == set(FRESHNESS)
    assert set(watched_assets(defs)) == set(FRESHNESS)
    sensor = defs.get_sensor_def("sync_errors_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING


def test_cdp_status_check_exit_codes(instance, conn, tenant):
    runner = CliRunner()
    obj = {"dagster_instance": instance}

    stale = runner.invoke(main, ["status", "--check", "--tenant", tenant], obj=obj)
    assert stale.exit_code == 1, stale.output
    assert f"{tenant}" in stale.output and "never" in stale.output
    informative = runner.invoke(main, ["status", "--tenant", tenant], obj=obj)
    assert informative.exit_code == 0, informative.output  # only --check turns it into a code

    for keys in watched_assets().values():
        for key in keys:
            partition = f"2025-01-01|{tenant}" if key.path == ["vtex_orders"] else tenant
            _materialized(instance, key.to_user_string(), partition)
    # Fresh assets alone are not health: the daemon must be alive and the operations fresh.
    platform = runner.invoke(main, ["status", "--check", "--json", "--tenant", tenant], obj=obj)
    assert platform.exit_code == 1, platform.output
    assert {p["check"] for p in json.loads(platform.output)["problems"]} == {"daemon", "asset"}
    daemon_alive(instance)
    instance.report_runless_asset_event(dg.AssetMaterialization("operations_metrics"))
    healthy = runner.invoke(main, ["status", "--check", "--json", "--tenant", tenant], obj=obj)
    assert healthy.exit_code == 0, healthy.output
    report = json.loads(healthy.output)
    assert report["healthy"] is True and report["problems"] == []
    assert sorted(a["asset"] for a in report["assets"]) == sorted(FRESHNESS)
    assert {a["tenant_id"] for a in report["assets"]} == {tenant}

    unknown = runner.invoke(main, ["status", "--tenant", "nobody_here"], obj=obj)
    assert unknown.exit_code == 2 and "no active tenant 'nobody_here'" in unknown.output
