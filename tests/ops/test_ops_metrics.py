"""Operations metrics: figures and check severities from synthetic histories, the same figures
read from real runs on the session's instance, connections the test really opens, the asset
with its checks, and one webhook post per crossing of an alert threshold."""

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dagster as dg
import psycopg
import pytest

from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.ops.assets import metric_check_results, metrics_metadata, operations_metrics
from cdp_assets.ops.metric_alerts import alert_on_crossings
from cdp_assets.ops.metrics import (
    DEFAULT_THRESHOLDS,
    INGESTION_ASSETS,
    THRESHOLDS_ENV,
    ApiSample,
    Connections,
    History,
    MetricsReport,
    RunSample,
    Severity,
    StepSample,
    collect_history,
    count_connections,
    evaluate,
    load_thresholds,
    render_metrics,
)
from cdp_assets.ops.resources import OpsMetricsResource
from cdp_assets.ops.status import collect_status, render_text, status_json
from cdp_assets.ops.webhook import WEBHOOK_ENV
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, tenants
from cdp_assets.tenants.registry import Tenant, add_tenant, set_active
from cdp_assets.vtex.resources import VtexResource

NOW = datetime(2026, 3, 10, 12, tzinfo=UTC)
SUCCESS, FAILURE = dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE
CANCELED, STARTED, QUEUED = (
    dg.DagsterRunStatus.CANCELED,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.QUEUED,
)
QUIET = Connections(database=3, server=10, max_connections=100)
ACCOUNTS = {"a1": "shopa", "a2": "shopa", "b1": "shopb", "c1": "shopc"}


def ago(hours: float) -> datetime:
    return NOW - timedelta(hours=hours)


def run(
    tenant: str | None, status: dg.DagsterRunStatus, ended_hours_ago: float, took_hours: float
) -> RunSample:
    ended = ago(ended_hours_ago)
    return RunSample(
        run_id=uuid.uuid4().hex,
        tenant_id=tenant,
        status=status,
        started_at=None if status == QUEUED else ended - timedelta(hours=took_hours),
        ended_at=None if status in (STARTED, QUEUED) else ended,
    )


def step(failed: bool, ended_hours_ago: float = 1, tenant: str | None = "a1") -> StepSample:
    return StepSample(uuid.uuid4().hex, tenant, "vtex_skus", failed, ago(ended_hours_ago))


def report_of(
    runs=(), steps=(), api=(), connections=QUIET, tenant_ids=None, accounts=ACCOUNTS
) -> MetricsReport:
    return evaluate(
        History(tuple(runs), tuple(steps), tuple(api)),
        connections,
        DEFAULT_THRESHOLDS,
        accounts,
        10.0,  # requests per second: a budget of 36,000 requests in the hour
        NOW,
        tenant_ids,
    )


def values(report: MetricsReport, metric: str) -> dict[str, float]:
    return {f.subject: round(f.value, 2) for f in report.of(metric)}


def severities(report: MetricsReport, metric: str) -> dict[str, Severity]:
    return {f.subject: f.severity for f in report.of(metric)}


def check(report: MetricsReport, metric: str) -> tuple[bool, dg.AssetCheckSeverity]:
    (result,) = [r for r in metric_check_results(report) if r.check_name == metric]
    return result.passed, result.severity


def test_sync_success_rate_per_tenant_over_the_ingestion_runs_finished_in_the_window():
    eight_good = [run("a1", SUCCESS, h, 0.2) for h in range(1, 9)]
    ignored = [
        run("a1", FAILURE, 25, 0.2),  # ended before the window
        run("a1", CANCELED, 2, 0.2),  # stopped by someone
        run("a1", STARTED, 0, 0.5),  # not finished yet
        run("a1", QUEUED, 0, 0),
    ]
    one_bad = [run("a1", FAILURE, 3, 0.2)]

    below_alert = report_of(eight_good + one_bad + ignored)  # 8 of 9
    assert values(below_alert, "sync_success_pct") == {"a1": 88.89}
    assert below_alert.counts["ingestion_runs"] == 9
    assert below_alert.counts["ingestion_runs_failed"] == 1
    assert check(below_alert, "sync_success_pct") == (False, dg.AssetCheckSeverity.ERROR)

    at_alert = report_of(eight_good + one_bad + [run("a1", SUCCESS, 4, 0.1)])  # 9 of 10
    assert values(at_alert, "sync_success_pct") == {"a1": 90.0}
    assert check(at_alert, "sync_success_pct") == (False, dg.AssetCheckSeverity.WARN)

    # Another tenant's good runs neither hide a1's failures nor are judged by them.
    many_good = [run("b1", SUCCESS, h / 2, 0.1) for h in range(12)]
    both = report_of(eight_good + one_bad + many_good)
    assert values(both, "sync_success_pct") == {"a1": 88.89, "b1": 100.0}
    assert severities(both, "sync_success_pct") == {"a1": Severity.ERROR, "b1": Severity.OK}
    assert round(both.aggregates["sync_success_pct"], 2) == 95.24  # 20 of 21
    (result,) = [r for r in metric_check_results(both) if r.check_name == "sync_success_pct"]
    assert not result.passed and "tenant" in result.description and "a1 88.9" in result.description
    assert "b1" not in result.description  # on target: not named

    # A range over several tenants is nobody's: judged as such, not charged to a tenant.
    ranged = report_of(many_good + [run(None, FAILURE, 1, 0.1)])
    assert values(ranged, "sync_success_pct") == {"b1": 100.0, "": 0.0}

    nothing = report_of(ignored)
    assert nothing.of("sync_success_pct") == []
    assert "sync_success_pct" not in nothing.aggregates
    assert check(nothing, "sync_success_pct")[0] is True  # no runs judge nothing


def test_a_deactivated_tenant_leaves_the_figures_at_once():
    failing = [run("a1", FAILURE, h, 0.2) for h in range(1, 4)]
    steps = [step(True, tenant="a1"), step(False, tenant="b1")]
    good = [run("b1", SUCCESS, 1, 0.2)]
    active = report_of(failing + good, steps=steps, api=[api(("a1",), 36000, 3600, 0)])
    assert set(values(active, "sync_success_pct")) == {"a1", "b1"}
    assert active.alerting

    # `account_of` holds the active tenants only: a1 deactivated, its runs, steps and account
    # are out, while b1's figures stay as they were.
    without_a1 = evaluate(
        History(tuple(failing + good), tuple(steps), (api(("a1",), 36000, 3600, 0),)),
        QUIET,
        DEFAULT_THRESHOLDS,
        {t: a for t, a in ACCOUNTS.items() if t not in ("a1", "a2")},
        10.0,
        NOW,
    )
    assert values(without_a1, "sync_success_pct") == {"b1": 100.0}
    assert values(without_a1, "step_error_pct") == {"b1": 0.0}
    assert without_a1.of("api_budget_pct") == []
    assert without_a1.alerting == []
    assert without_a1.counts["ingestion_runs"] == 1


def test_average_sync_time_per_tenant_with_slow_and_stuck_runs():
    runs = [
        run("a1", SUCCESS, 1, 0.5),
        run("a1", FAILURE, 2, 0.25),  # a failed run's time was spent syncing too
        run("b1", SUCCESS, 3, 5),  # one slow sync
        run("c1", SUCCESS, 2, 3),
        run("c1", STARTED, 0, 1),  # still going: counted with its hour so far
        run("c1", SUCCESS, 30, 9),  # ended before the window
        run(None, SUCCESS, 1, 8),  # a range over several tenants: nobody's
    ]
    report = report_of(runs)
    assert values(report, "avg_sync_seconds") == {"a1": 1350.0, "b1": 18000.0, "c1": 7200.0}
    assert severities(report, "avg_sync_seconds") == {
        "a1": Severity.OK,
        "b1": Severity.ERROR,  # over 4 h
        "c1": Severity.WARN,  # 2 h is not under 2 h
    }
    assert check(report, "avg_sync_seconds") == (False, dg.AssetCheckSeverity.ERROR)
    (result,) = [r for r in metric_check_results(report) if r.check_name == "avg_sync_seconds"]
    assert result.metadata["subject"].value == "b1"
    assert "worst b1 18000.0 (error), c1 7200.0 (warn)" in result.description

    assert values(report_of(runs, tenant_ids={"a1"}), "avg_sync_seconds") == {"a1": 1350.0}
    # Every run counts in the aggregate, the range over several tenants too.
    assert report.aggregates["avg_sync_seconds"] == (1800 + 900 + 18000 + 10800 + 3600 + 28800) / 6


def test_step_error_rate():
    def pct(ok: int, failed: int) -> tuple[float, Severity]:
        steps = [step(False)] * ok + [step(True)] * failed + [step(True, ended_hours_ago=30)]
        (figure,) = report_of(steps=steps).of("step_error_pct")
        return round(figure.value, 2), figure.severity

    assert pct(20, 1) == (4.76, Severity.OK)
    assert pct(19, 1) == (5.0, Severity.WARN)
    assert pct(9, 1) == (10.0, Severity.WARN)
    assert pct(8, 1) == (11.11, Severity.ERROR)
    steps = [step(False, tenant="a1"), step(True, tenant="b1"), step(True, tenant=None)]
    assert values(report_of(steps=steps, tenant_ids={"a1"}), "step_error_pct") == {"a1": 0.0}
    everyone = report_of(steps=steps)
    assert values(everyone, "step_error_pct") == {"a1": 0.0, "b1": 100.0, "": 100.0}
    assert round(everyone.aggregates["step_error_pct"], 2) == 66.67
    assert everyone.counts["steps_failed"] == 2


def api(
    tenants: tuple[str, ...], requests: int, seconds: float, ended_hours_ago: float, throttled=0
):
    return ApiSample(
        uuid.uuid4().hex, "vtex_orders", tenants, requests, throttled, seconds, ago(ended_hours_ago)
    )


def test_api_budget_per_account_with_429_heavy_and_straddling_syncs():
    report = report_of(
        api=[
            api(("a1",), 18000, 1800, 1 / 6),
            api(("a2",), 10800, 600, 0.5),  # another tenant of the same account
            api(("a1", "c1"), 7200, 720, 0.25),  # one run, two accounts: half each
            api(("b1",), 40000, 3600, 0, throttled=3000),  # 429-heavy, over the budget
            # 2 h of requests ending 30 min ago: the window holds a quarter of them.
            api(("c1",), 14400, 7200, 0.5, throttled=400),
            api(("c1",), 99999, 60, 1.5),  # ended before the window
            api(("nobody",), 99999, 60, 0.1),  # no such tenant
        ]
    )
    assert values(report, "api_budget_pct") == {"shopa": 90.0, "shopb": 111.11, "shopc": 20.0}
    assert severities(report, "api_budget_pct") == {
        "shopa": Severity.WARN,  # 90 % is not over 90 %
        "shopb": Severity.ERROR,
        "shopc": Severity.OK,
    }
    assert report.counts["api_requests/shopa"] == 32400
    assert report.counts["api_429_responses/shopb"] == 3000
    assert report.counts["api_requests/shopc"] == 7200  # 3600 + a quarter of 14400
    assert report.counts["api_429_responses/shopc"] == 100
    assert check(report, "api_budget_pct") == (False, dg.AssetCheckSeverity.ERROR)

    assert (
        round(report.aggregates["api_budget_pct"], 2) == values(report, "api_budget_pct")["shopb"]
    )

    # Each sync is judged at the pace its client kept, whatever pace the reader would set: a
    # run at 20 requests/s used half the budget the same requests use at 10.
    paced = replace(api(("b1",), 18000, 1800, 0), requests_per_second=20.0)
    assert values(report_of(api=[paced]), "api_budget_pct") == {"shopb": 25.0}

    # A tenant's status reads its own account, whoever else uses it.
    scoped = report_of(
        api=[api(("a2",), 3600, 60, 0.1), api(("b1",), 3600, 60, 0.1)], tenant_ids={"a1"}
    )
    assert values(scoped, "api_budget_pct") == {"shopa": 10.0}


def test_connection_thresholds_and_the_metadata():
    def judged(count: int) -> Severity:
        connections = Connections(database=count, server=count + 5, max_connections=100)
        return report_of(connections=connections).of("db_connections")[0].severity

    assert [judged(n) for n in (49, 50, 80, 81)] == [
        Severity.OK,
        Severity.WARN,
        Severity.WARN,
        Severity.ERROR,
    ]
    report = report_of(
        runs=[run("a1", SUCCESS, 1, 0.5)], api=[api(("b1",), 3600, 60, 0.1, throttled=7)]
    )
    assert metrics_metadata(report) == {
        "sync_success_pct": 100.0,
        "sync_success_pct/target": 95,
        "sync_success_pct/alert": 90,
        "sync_success_pct/worst": "none",
        "avg_sync_seconds": 1800.0,
        "avg_sync_seconds/target": 7200,
        "avg_sync_seconds/alert": 14400,
        "avg_sync_seconds/worst": "none",
        "step_error_pct/target": 5,
        "step_error_pct/alert": 10,
        "step_error_pct/worst": "none",
        "api_budget_pct": 10.0,
        "api_budget_pct/target": 80,
        "api_budget_pct/alert": 90,
        "api_budget_pct/worst": "none",
        "db_connections": 3.0,
        "db_connections/target": 50,
        "db_connections/alert": 80,
        "ingestion_runs": 1,
        "ingestion_runs_failed": 0,
        "steps": 0,
        "steps_failed": 0,
        "api_requests": 3600.0,
        "api_429_responses": 7.0,
        "db_connections_server": 10,
        "db_max_connections": 100,
    }


def test_the_metadata_of_41_tenants_plots_each_metric_once_and_names_the_worst():
    tenants_41 = {f"t{n:02d}": f"shop{n:02d}" for n in range(41)}
    runs = [run(t, SUCCESS, 1, 0.5) for t in tenants_41]
    runs += [run("t07", FAILURE, 2, 0.5), run("t07", FAILURE, 3, 0.5)]  # 1 of 3: error
    runs += [run("t13", FAILURE, 2, 5)] + [run("t13", SUCCESS, h, 0.1) for h in range(3, 13)]
    report = evaluate(
        History(tuple(runs), (), ()), QUIET, DEFAULT_THRESHOLDS, tenants_41, 10.0, NOW
    )
    metadata = metrics_metadata(report)
    numbers = [k for k, v in metadata.items() if isinstance(v, int | float)]
    # One series per metric (its aggregate, target and alert) and the totals: none per tenant.
    assert not any(t in key for key in numbers for t in tenants_41)
    assert len(numbers) <= 3 * len(DEFAULT_THRESHOLDS) + 10
    assert metadata["sync_success_pct/worst"] == "t07 33.3 (error), t13 91.7 (warn)"
    assert metadata["avg_sync_seconds/worst"] == "none"
    lines = render_metrics(report).splitlines()
    # Each metric on one line, then only the tenants off target: one line for t07's rate.
    assert [line.split()[0] for line in lines if line.startswith("    ")] == ["t07", "t13"]
    assert not any("t00" in line for line in lines)


def test_thresholds_come_from_defaults_env_and_resource_config():
    env = {THRESHOLDS_ENV: json.dumps({"avg_sync_seconds": {"target": 60, "alert": 300}})}
    found = load_thresholds({"avg_sync_seconds": {"alert": 600}}, env)
    assert (found["avg_sync_seconds"].target, found["avg_sync_seconds"].alert) == (60, 600)
    assert found["sync_success_pct"] == DEFAULT_THRESHOLDS["sync_success_pct"]
    assert load_thresholds(environ={}) == DEFAULT_THRESHOLDS
    assert (
        OpsMetricsResource(thresholds={"db_connections": {"alert": 90}})
        .in_force()["db_connections"]
        .alert
        == 90
    )

    with pytest.raises(ValueError, match="unknown metric 'latency'"):
        load_thresholds({"latency": {"alert": 1}}, {})
    with pytest.raises(ValueError, match="only 'target' and 'alert'"):
        load_thresholds({"db_connections": {"warn": 1}}, {})
    with pytest.raises(ValueError, match="sync_success_pct: alert 96 is better than target"):
        load_thresholds({"sync_success_pct": {"alert": 96}}, {})
    with pytest.raises(ValueError, match="is not JSON"):
        load_thresholds(environ={THRESHOLDS_ENV: "{oops"})


# Named like the platform's assets: the metrics know ingestion by asset key.
class FakeSync(dg.Config):
    requests: int = 0
    throttled: int = 0
    seconds: float = 0.0
    fail: bool = False


@dg.asset(name="vtex_skus", partitions_def=tenants)
def fake_skus(config: FakeSync) -> dg.MaterializeResult:
    if config.fail:
        raise RuntimeError("VTEX answered 503 until the retries ran out")
    return dg.MaterializeResult(
        metadata={
            "api_requests": config.requests,
            "api_429_responses": config.throttled,
            "api_retries": config.throttled,
            "seconds": config.seconds,
        }
    )


@dg.asset(name="vtex_orders_feed", partitions_def=tenants)
def fake_feed(context) -> dg.MaterializeResult:
    """A drain over a block of tenants: each records its own requests, 1,000 per rank."""
    for rank, tenant_id in enumerate(context.partition_keys, start=1):
        context.add_asset_metadata(
            {"api_requests": 1000 * rank, "api_429_responses": rank, "seconds": 60.0},
            partition_key=tenant_id,
        )
    return dg.MaterializeResult()


@dg.asset(name="rfm_segments", partitions_def=tenants)
def fake_model() -> dg.MaterializeResult:
    """A dbt model's key: its runs are not syncs, its steps still count."""
    return dg.MaterializeResult()


def sync(instance: dg.DagsterInstance, tenant: str, **config) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [fake_skus],
        instance=instance,
        partition_key=tenant,
        run_config={"ops": {"vtex_skus": {"config": config}}},
        raise_on_error=False,
    )


@pytest.fixture
def shop(warehouse_url: str, instance: dg.DagsterInstance) -> Iterator[tuple[list[str], str]]:
    """Two new active tenants of one new VTEX account, with their partitions."""
    suffix = uuid.uuid4().hex[:8]
    account = f"metrics-{suffix}"
    tenant_ids = [f"om_{suffix}_a", f"om_{suffix}_b"]
    with psycopg.connect(warehouse_url) as conn:
        for tenant_id in tenant_ids:
            add_tenant(conn, Tenant(tenant_id, account, "OM_KEY", "OM_TOKEN"))
    instance.add_dynamic_partitions(tenants.name, tenant_ids)
    yield tenant_ids, account
    for tenant_id in tenant_ids:
        instance.delete_dynamic_partition(tenants.name, tenant_id)
    with psycopg.connect(warehouse_url) as conn:
        for tenant_id in tenant_ids:
            set_active(conn, tenant_id, False)


def test_a_feed_drain_over_a_block_counts_each_tenants_requests_on_its_account(
    instance, warehouse_url
):
    """A drain over two neighbouring tenants of two VTEX accounts: each account is charged its
    own tenant's requests, not half of the run's."""
    suffix = uuid.uuid4().hex[:8]
    block = {f"of_{suffix}_a": f"feeda-{suffix}", f"of_{suffix}_b": f"feedb-{suffix}"}
    with psycopg.connect(warehouse_url) as conn:
        for tenant_id, account in block.items():
            add_tenant(conn, Tenant(tenant_id, account, "OF_KEY", "OF_TOKEN"))
    instance.add_dynamic_partitions(tenants.name, list(block))
    try:
        first, second = block
        drained = dg.materialize(
            [fake_feed], instance=instance, tags={RANGE_START_TAG: first, RANGE_END_TAG: second}
        )
        assert drained.success
        now = datetime.now(UTC)
        history = collect_history(instance, now)
        samples = {s.tenant_ids: s for s in history.api if s.run_id == drained.run_id}
        assert {t: s.requests for t, s in samples.items()} == {(first,): 1000, (second,): 2000}
        report = evaluate(history, QUIET, DEFAULT_THRESHOLDS, block, 10.0, now)
        assert report.counts[f"api_requests/{block[first]}"] == 1000
        assert report.counts[f"api_requests/{block[second]}"] == 2000
        assert report.counts[f"api_429_responses/{block[second]}"] == 2
    finally:
        for tenant_id in block:
            instance.delete_dynamic_partition(tenants.name, tenant_id)
        with psycopg.connect(warehouse_url) as conn:
            for tenant_id in block:
                set_active(conn, tenant_id, False)


def test_the_figures_of_real_runs_on_the_instance(instance, conn, shop):
    (first, second), account = shop
    ok = sync(instance, first, requests=18000, throttled=900, seconds=1800)
    sync(instance, first, requests=100, seconds=10)
    failed = sync(instance, first, fail=True)
    sync(instance, second, requests=10800, seconds=1800)
    model = dg.materialize([fake_model], instance=instance, partition_key=first)
    assert ok.success and not failed.success and model.success

    now = datetime.now(UTC)
    history = collect_history(instance, now)
    mine = {r.run_id: r for r in history.runs if r.tenant_id in (first, second)}
    assert len(mine) == 4 and model.run_id not in mine  # a model run is no sync
    assert mine[failed.run_id].status == FAILURE
    assert all(0 < (r.ended_at - r.started_at).total_seconds() < 60 for r in mine.values())

    report = evaluate(
        history,
        count_connections(conn),
        DEFAULT_THRESHOLDS,
        {first: account, second: account},
        10.0,
        now,
        tenant_ids={first, second},
    )
    assert values(report, "sync_success_pct") == {first: 66.67, second: 100.0}
    assert severities(report, "sync_success_pct") == {first: Severity.ERROR, second: Severity.OK}
    assert report.aggregates["sync_success_pct"] == 75.0
    assert set(values(report, "avg_sync_seconds")) == {first, second}
    # The first tenant's 1 failed step of 4 (3 syncs, 1 model); the second's 1 sync.
    assert values(report, "step_error_pct") == {first: 25.0, second: 0.0}
    # 28,900 requests of the account's 36,000 in the hour, whichever tenant made them.
    assert values(report, "api_budget_pct") == {account: 80.28}
    assert report.counts[f"api_429_responses/{account}"] == 900

    # `cdp status` for these tenants: every asset fresh, but a metric past its alert.
    for tenant in (first, second):
        instance.report_runless_asset_event(
            dg.AssetMaterialization("vtex_products", partition=tenant)
        )
    status = collect_status(
        instance,
        conn,
        tenant_ids=[first, second],
        watched={"vtex_products": (dg.AssetKey("vtex_products"),)},
    )
    assert all(a.ok for a in status.assets)
    assert status.healthy is False
    assert (
        f"2 past the alert threshold: sync_success_pct/{first}, step_error_pct/{first}"
        in render_text(status)
    )
    reported = status_json(status)
    assert reported["metrics"]["alerting"] is True
    assert {"metric": "step_error_pct", "subject": first, "value": 25.0, "severity": "error"} in (
        reported["metrics"]["figures"]
    )
    # The verdict names the tenant whose figures are past the alert threshold.
    metric_problems = [p for p in reported["problems"] if p["check"] == "metric"]
    assert {(p["subject"], p["tenant_id"]) for p in metric_problems} == {
        (f"sync_success_pct/{first}", first),
        (f"step_error_pct/{first}", first),
    }


def test_the_connection_count_follows_connections_the_test_opens(conn, warehouse_url):
    extra = 4
    before = count_connections(conn)
    opened = [psycopg.connect(warehouse_url, application_name="ops-metrics-test")]
    opened += [psycopg.connect(warehouse_url) for _ in range(extra - 1)]
    try:
        during = count_connections(conn)
    finally:
        for connection in opened:
            connection.close()
    assert during.database >= before.database + extra
    assert during.server >= during.database and during.max_connections > 0

    deadline = time.monotonic() + 5  # a closed connection's backend exits shortly after
    while (after := count_connections(conn)).database > during.database - extra:
        assert time.monotonic() < deadline, (during, after)
        time.sleep(0.05)


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[str]]]:
    """A Slack-like webhook on loopback: (its URL, the texts it received)."""
    received: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(json.loads(body)["text"])
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hooks/ops", received
    server.shutdown()
    server.server_close()


def test_the_asset_materializes_with_its_checks_and_alerts_once_per_crossing(
    instance, conn, warehouse_url, shop, webhook, monkeypatch
):
    (tenant, _), account = shop
    url, received = webhook
    monkeypatch.setenv(WEBHOOK_ENV, url)
    monkeypatch.delenv(THRESHOLDS_ENV, raising=False)
    with conn.transaction():  # whatever an earlier test left: this test crosses it afresh
        conn.execute("DELETE FROM cdp.ops_metric_states WHERE metric = 'db_connections'")
    # 34,200 requests of the 36,000 an hour at 10/s allows: 95 %, past the 90 % alert.
    assert sync(instance, tenant, requests=34200, throttled=1200, seconds=1800).success

    # Thresholds that make every check's outcome certain whatever else the session ran.
    certain = {
        "sync_success_pct": {"target": 100, "alert": 0},  # warn: no rate is above 100 %
        "step_error_pct": {"target": 101, "alert": 101},  # passes: no rate is above 100 %
        "db_connections": {"target": 0, "alert": 1},  # error: the test's and the asset's
    }

    def evaluate_asset(api_budget: dict | None = None) -> dg.ExecuteInProcessResult:
        thresholds = {**certain, **({"api_budget_pct": api_budget} if api_budget else {})}
        return dg.materialize(
            [operations_metrics],
            instance=instance,
            resources={
                "warehouse": WarehouseResource(url=warehouse_url),
                "vtex": VtexResource(requests_per_second=10),
                "ops_metrics": OpsMetricsResource(thresholds=thresholds),
            },
        )

    def posts() -> tuple[list[str], list[str]]:
        """What reached the webhook about this test's account, and about connections."""
        return (
            [t for t in received if f"account {account} " in t],
            [t for t in received if "db_connections" in t],
        )

    before = count_connections(conn).database
    extra = [psycopg.connect(warehouse_url) for _ in range(3)]
    try:
        first = evaluate_asset()
    finally:
        for connection in extra:
            connection.close()
    assert first.success
    (materialization,) = first.asset_materializations_for_node("operations_metrics")
    metadata = {k: v.value for k, v in materialization.metadata.items()}
    # Whatever other accounts the session's tests used, this one is among the worst named.
    assert f"{account} 95.0 (error)" in metadata["api_budget_pct/worst"]
    assert metadata["api_budget_pct"] >= 95.0
    assert metadata["api_requests"] >= 34200 and metadata["api_429_responses"] >= 1200
    assert (metadata["api_budget_pct/target"], metadata["api_budget_pct/alert"]) == (80, 90)
    assert metadata["db_connections"] >= before + 3  # the extra ones were open when it counted
    outcomes = {e.check_name: (e.passed, e.severity) for e in first.get_asset_check_evaluations()}
    assert outcomes == {
        "sync_success_pct": (False, dg.AssetCheckSeverity.WARN),
        "avg_sync_seconds": (True, dg.AssetCheckSeverity.WARN),
        "step_error_pct": (True, dg.AssetCheckSeverity.WARN),
        "api_budget_pct": (False, dg.AssetCheckSeverity.ERROR),
        "db_connections": (False, dg.AssetCheckSeverity.ERROR),
    }
    alert = (
        f"cdp metric alert: api_budget_pct for account {account} is 95.0, past its alert"
        " threshold (target < 80, alert > 90)"
    )
    api_posts, db_posts = posts()
    assert api_posts == [alert]
    assert len(db_posts) == 1 and db_posts[0].startswith("cdp metric alert: db_connections is ")

    assert evaluate_asset().success  # still past both thresholds: nothing new
    assert posts() == ([alert], db_posts)

    assert evaluate_asset({"target": 96, "alert": 99}).success  # 95 % is on target now
    recovered = (
        f"cdp metric recovered: api_budget_pct for account {account} is 95.0"
        " (target < 96, alert > 99)"
    )
    assert posts() == ([alert, recovered], db_posts)

    assert evaluate_asset().success  # past the alert threshold again
    assert posts() == ([alert, recovered, alert], db_posts)


def test_an_alert_the_webhook_did_not_take_is_posted_at_the_next_evaluation(conn, caplog):
    tenant = f"om_{uuid.uuid4().hex[:8]}"
    judged = report_of(runs=[run(tenant, SUCCESS, 1, 5)], accounts={tenant: "shopz"})
    # This tenant's figure only: platform-wide ones share their state with other tests.
    slow = replace(judged, figures=tuple(judged.of("avg_sync_seconds")))
    log = logging.getLogger("test_ops_metrics")
    received: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
            self.send_response(500 if len(received) == 1 else 200)  # refuses the first
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/hooks/ops"
    try:
        with caplog.at_level(logging.WARNING, logger="test_ops_metrics"):
            assert alert_on_crossings(conn, slow, url, log) == []  # refused: not recorded
            (posted,) = alert_on_crossings(conn, slow, url, log)
            assert alert_on_crossings(conn, slow, url, log) == []
    finally:
        server.shutdown()
        server.server_close()
    assert posted.figure.subject == tenant and posted.previous == Severity.OK
    assert len(received) == 2 and received[0] == received[1]
    assert f"avg_sync_seconds for tenant {tenant} is 18000.0" in received[1]
    assert [r.getMessage() for r in caplog.records] == [
        "alert webhook not reached (HTTPError, HTTP 500)"
    ]
    state = conn.execute(
        "SELECT severity, value FROM cdp.ops_metric_states WHERE subject = %s", (tenant,)
    ).fetchone()
    assert state == ("error", 18000.0)


def test_the_ingestion_assets_are_the_vtex_group_and_the_schedule_runs_by_default():
    from cdp_assets.definitions import defs

    vtex_group = {
        a.node_def.name
        for a in defs.assets
        if isinstance(a, dg.AssetsDefinition)
        and a.group_names_by_key
        and "vtex" in (a.group_names_by_key.values())
    }
    assert vtex_group == set(INGESTION_ASSETS)
    schedule = defs.get_schedule_def("operations_metrics_every_15_minutes")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert schedule.cron_schedule == "*/15 * * * *"
    assert defs.get_assets_def("operations_metrics").check_keys == {
        dg.AssetCheckKey(dg.AssetKey("operations_metrics"), name) for name in DEFAULT_THRESHOLDS
    }
