"""The platform's health: one verdict for `cdp status --check` and the HTTP endpoint of
`cdp health`, which an uptime probe reads. The endpoint runs as its own process beside a real
dagster-daemon, on a throwaway server the test stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import psycopg
import pytest
import requests
from click.testing import CliRunner
from support import daemon_alive
from support.dagster_services import BIN, ROOT, free_port, start_process, stop_processes, wait_for
from support.throwaway_postgres import throwaway_postgres

from cdp_assets.analytics.dbt_project import ensure_manifest
from cdp_assets.cli import main
from cdp_assets.framework.dagster_storage import storage_config
from cdp_assets.lib.dagster_home import prepare_dagster_home
from cdp_assets.lib.database import sqlalchemy_url, with_database
from cdp_assets.lib.migrations import migrated_url
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.ops.assets import operations_metrics
from cdp_assets.ops.health import HEARTBEAT_TOLERANCE_ENV, instigator_problems, instigators_of
from cdp_assets.ops.metrics import THRESHOLDS_ENV
from cdp_assets.ops.resources import OpsMetricsResource
from cdp_assets.ops.status import collect_status, watched_assets
from cdp_assets.ops.surface import read_surface
from cdp_assets.partitions import tenants
from cdp_assets.tenants.registry import Tenant, add_tenant, set_active
from cdp_assets.vtex.resources import VtexResource


class SyncBrokeError(RuntimeError):
    pass


# Named like the platform's asset: the event log (and so the verdict) knows assets by key.
@dg.asset(name="vtex_skus", partitions_def=tenants)
def failing_skus() -> None:
    raise SyncBrokeError("VTEX answered 503 until the retries ran out")


@pytest.fixture
def own_platform(warehouse_url: str) -> Iterator[tuple[str, dg.DagsterInstance]]:
    """A warehouse and a Dagster instance of their own, so the verdict over every active
    tenant sees this test's tenants only."""
    name = f"cdp_health_{uuid.uuid4().hex[:8]}"
    url = migrated_url(with_database(warehouse_url, name))
    overrides = {"storage": storage_config(sqlalchemy_url(url)), "telemetry": {"enabled": False}}
    try:
        with dg.instance_for_test(overrides=overrides) as instance:
            yield url, instance
    finally:
        with psycopg.connect(with_database(warehouse_url, "postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _ticked(instance: dg.DagsterInstance) -> set[str]:
    """The schedules and sensors the daemon has evaluated at least once."""
    return {
        state.instigator_name
        for state in instance.all_instigator_state()
        if instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=1)
    }


def _all_fresh(instance: dg.DagsterInstance, tenant: str) -> None:
    for keys in watched_assets().values():
        for key in keys:
            partition = f"2025-01-01|{tenant}" if key.path == ["vtex_orders"] else tenant
            instance.report_runless_asset_event(dg.AssetMaterialization(key, partition=partition))


def test_one_tenants_failure_or_deactivation_leaves_the_others_verdict(own_platform, monkeypatch):
    url, instance = own_platform
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.delenv(THRESHOLDS_ENV, raising=False)
    failing, fine = "health_failing", "health_fine"
    with psycopg.connect(url) as conn:
        for tenant in (failing, fine):
            add_tenant(conn, Tenant(tenant, tenant.replace("_", ""), "HEALTH_KEY", "HEALTH_TOKEN"))
    instance.add_dynamic_partitions(tenants.name, [failing, fine])
    for tenant in (failing, fine):
        _all_fresh(instance, tenant)
    daemon_alive(instance)
    instance.report_runless_asset_event(dg.AssetMaterialization("operations_metrics"))

    def verdict(*args: str) -> tuple[int, dict]:
        result = CliRunner().invoke(
            main, ["status", "--check", "--json", *args], obj={"dagster_instance": instance}
        )
        return result.exit_code, json.loads(result.output)

    code, before = verdict()
    assert (code, before["healthy"], before["problems"]) == (0, True, [])

    for _ in range(3):  # every sync of one tenant fails: its asset, and its success rate
        result = dg.materialize(
            [failing_skus], instance=instance, partition_key=failing, raise_on_error=False
        )
        assert not result.success

    code, everyone = verdict()
    assert code == 1
    assert {p["tenant_id"] for p in everyone["problems"]} == {failing}
    assert {p["subject"] for p in everyone["problems"]} == {
        "vtex_skus",
        f"sync_success_pct/{failing}",
        f"step_error_pct/{failing}",
    }
    code, other = verdict("--tenant", fine)
    assert (code, other["problems"]) == (0, [])
    assert failing not in json.dumps(other["metrics"]["figures"])

    # Deactivated, the failing tenant leaves the verdict and the figures at once.
    with psycopg.connect(url) as conn:
        set_active(conn, failing, False)
    code, after = verdict()
    assert (code, after["problems"]) == (0, [])
    assert failing not in json.dumps(after["metrics"])


def test_the_daemon_and_operations_judged_by_the_clock(own_platform, monkeypatch):
    url, instance = own_platform
    monkeypatch.setenv("DATABASE_URL", url)
    daemon_alive(instance)
    instance.report_runless_asset_event(dg.AssetMaterialization("operations_metrics"))
    runner = CliRunner()
    obj = {"dagster_instance": instance}
    assert runner.invoke(main, ["status", "--check"], obj=obj).exit_code == 0
    with psycopg.connect(url) as conn:
        later = collect_status(instance, conn, now=datetime.now(UTC) + timedelta(minutes=50))
    found = {(p.check, p.subject.split(",")[0]): p.detail for p in later.problems}
    assert "is dagster-daemon running?" in found[("daemon", "ASSET")]
    assert "is its schedule running?" in found[("asset", "operations_metrics")]


# What loading the code location imports (`cdp_assets.definitions`: dbt's manifest, the
# destinations' SDKs, the predictions' fitting), none of which a verdict needs.
CODE_LOCATION_MODULES = {
    "cdp_assets.definitions",
    "dagster_dbt",
    "scipy",
    "facebook_business",
    "google.ads.googleads",
}


def test_cdp_status_check_in_its_own_process_does_not_load_the_code_location(
    own_platform, tmp_path: Path, monkeypatch
):
    """As a probe or an operator runs it: the schedules, sensors and watched assets come from
    the code location's committed surface, so the verdict costs its queries, not the imports."""
    url, _ = own_platform
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.setenv("CDP_DAGSTER_PG_URL", "")  # restored after; set by prepare_dagster_home
    prepare_dagster_home(url)
    with dg.DagsterInstance.get() as instance:
        daemon_alive(instance)
        instance.report_runless_asset_event(dg.AssetMaterialization("operations_metrics"))
    result = subprocess.run(
        [str(BIN / "cdp"), "status", "--check"],
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "healthy"
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "cdp_assets.ops.status" in imported  # the log is of the status path
    assert not imported & CODE_LOCATION_MODULES


def _health(url: str) -> tuple[int, dict] | None:
    try:
        response = requests.get(url, timeout=20)
    except requests.RequestException:
        return None
    return response.status_code, response.json()


def _answers(url: str, status: int, check: str | None = None, subject: str | None = None):
    """A probe of `url` that is truthy once it answers `status` with a problem of `check`
    (and `subject`, a prefix) among its reasons."""

    def probe() -> dict | None:
        answer = _health(url)
        if answer is None or answer[0] != status:
            return None
        body = answer[1]
        if check is None:
            return body
        for problem in body["problems"]:
            if problem["check"] == check and problem["subject"].startswith(subject or ""):
                return body
        return None

    return probe


def test_the_health_endpoint_answers_200_then_503_naming_the_reason(tmp_path: Path, monkeypatch):
    with throwaway_postgres("cdp_health_endpoint") as postgres, ExitStack() as stack:
        monkeypatch.setenv("DATABASE_URL", postgres.url)
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
        monkeypatch.setenv("CDP_DAGSTER_PG_URL", "")  # restored after; set by prepare_dagster_home
        prepare_dagster_home(postgres.url)
        monkeypatch.setenv(HEARTBEAT_TOLERANCE_ENV, "40")
        # Connections are a metric the test can push past its alert threshold for real.
        monkeypatch.setenv(
            THRESHOLDS_ENV, json.dumps({"db_connections": {"target": 30, "alert": 40}})
        )
        ensure_manifest()  # the daemon loads the code location, dbt's manifest with it
        instance = stack.enter_context(dg.DagsterInstance.get())
        assert dg.materialize(
            [operations_metrics],
            instance=instance,
            resources={
                "warehouse": WarehouseResource(url=postgres.url),
                "vtex": VtexResource(),
                "ops_metrics": OpsMetricsResource(thresholds={"db_connections": {"alert": 1000}}),
            },
        ).success

        port = free_port()
        health = f"http://127.0.0.1:{port}/health"
        env = dict(os.environ)
        logs = {name: tmp_path / f"{name}.log" for name in ("daemon", "health")}
        processes = {
            "daemon": start_process(
                [str(BIN / "dagster-daemon"), "run", "-w", str(ROOT / "workspace.yaml")],
                env,
                logs["daemon"],
            ),
            "health": start_process(
                [str(BIN / "cdp"), "health", "--port", str(port)], env, logs["health"]
            ),
        }
        stack.callback(stop_processes, processes)

        healthy = wait_for("a healthy answer", _answers(health, 200), timeout=240, every=2)
        assert healthy["healthy"] is True and healthy["problems"] == []
        assert _health(f"http://127.0.0.1:{port}/other")[0] == 404

        # Every schedule and sensor the daemon ticks is judged: fine now, stalled if the
        # clock ran on with no tick. A sensor the daemon has not evaluated yet has no state to
        # judge (a loaded machine can answer healthy first), so the judgement waits for both.
        judged = {"tenant_partitions_sensor", "sync_errors_sensor"}
        wait_for("both sensors' first ticks", lambda: judged <= _ticked(instance), timeout=120)
        instigators = instigators_of(read_surface())
        now = datetime.now(UTC)
        assert instigator_problems(instance, instigators, now) == []
        stalled = instigator_problems(instance, instigators, now + timedelta(minutes=20))
        assert judged <= {p.subject for p in stalled}

        # A metric past its alert threshold, then back under it.
        extra = [psycopg.connect(postgres.url) for _ in range(45)]
        try:
            crossed = wait_for(
                "db_connections past its alert threshold",
                _answers(health, 503, "metric", "db_connections"),
                timeout=60,
            )
        finally:
            for connection in extra:
                connection.close()
        (problem,) = crossed["problems"]
        assert "past its alert threshold (target < 30, alert > 40)" in problem["detail"]
        wait_for("a healthy answer again", _answers(health, 200), timeout=60)

        # The daemon killed: its heartbeats age past the tolerance.
        os.killpg(processes["daemon"].pid, signal.SIGKILL)
        silent = wait_for(
            "the silent daemon", _answers(health, 503, "daemon"), timeout=120, every=3
        )
        assert "is dagster-daemon running?" in silent["problems"][0]["detail"]

        # Postgres unreachable: said at once, and only that.
        postgres.stop()
        down = wait_for("the database down", _answers(health, 503, "database"), timeout=60)
        assert [p["check"] for p in down["problems"]] == ["database"]
        assert postgres.url.split("@")[0] not in json.dumps(down)  # no credentials echoed
