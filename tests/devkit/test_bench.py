"""`cdp bench --scale small` end to end: the report's shape and that its counts agree.

A smoke test of the benchmark suite, not of speed: no timing is asserted, only that every
stage ran through the platform's jobs, measured what it should and that the records add up
(orders landed == orders in the sandbox, members pushed == members the platforms hold).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cdp_assets.activation.jobs import activation_push
from cdp_assets.analytics.dbt_files import DBT_PROJECT_DIR
from cdp_assets.analytics.jobs import ANALYTICS_JOB, AUDIENCES_JOB, CHANGES_JOB
from cdp_assets.vtex.jobs import FEED_SYNC_JOB, ORDERS_SYNC_JOB
from cdp_devkit.bench import SCALES, run_bench
from cdp_devkit.bench.report import render_summary

# The first test pays for the module's run.
pytestmark = pytest.mark.timeout(900)

STAGES = ("write_path", "ingestion", "analytics", "activation", "masterdata", "increment")
# Half the small scale's history: every stage and check alike on less data, and the reduced
# path (`cdp bench --fraction`) with it.
FRACTION = 0.5
SMALL = SCALES["small"].reduced(FRACTION)
DBT_MODELS = {path.stem for path in (DBT_PROJECT_DIR / "models").rglob("*.sql")}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    folder = tmp_path_factory.mktemp("bench")
    return run_bench("small", folder, echo=lambda _: None, fraction=FRACTION), folder


def test_every_stage_reports_time_rate_memory_and_size(small):
    report, _ = small
    assert tuple(report["stages"]) == STAGES
    for name, stage in report["stages"].items():
        assert stage["wall_seconds"] > 0, name
        assert stage["records"] > 0, name
        assert stage["records_per_second"] > 0, name
        assert stage["peak_rss_mb"] > 0 and stage["peak_rss_exact"], name
        if name != "write_path":  # the only stage that runs no Dagster run
            assert stage["child_peak_rss_mb"] > 0, name
            assert stage["child_peak_process"] in ("run worker", "dbt build"), name
        assert stage["sandbox_peak_rss_mb"] > 0, name  # measured apart from ours
        assert stage["database_size_mb"] > 0, name
    assert report["environment"]["cpus"] and report["environment"]["postgres_version"]
    assert report["environment"]["postgres_settings"]["autovacuum"] in ("on", "off")
    assert report["environment"]["run_workers"] >= 1
    assert report["workload"]["tenants"] == SMALL.tenants


def test_counts_agree_with_the_sandbox(small):
    report, _ = small
    checks = report["consistency"]
    assert {c["stage"] for c in checks} == {
        "ingestion",
        "analytics",
        "activation",
        "masterdata",
        "increment",
    }
    assert [c for c in checks if not c["ok"]] == []
    stages = report["stages"]
    assert stages["ingestion"]["records_received"]["vtex_orders"] == SMALL.orders
    assert stages["ingestion"]["records_received"]["vtex_customers"] == SMALL.customers
    plan = SMALL.increment()
    assert stages["increment"]["new_orders"] == sum(new for new, _ in plan)
    assert stages["increment"]["orders_inserted"] == stages["increment"]["new_orders"]


def test_write_path_compares_three_methods_on_the_same_documents(small):
    write = small[0]["stages"]["write_path"]
    assert set(write["methods"]) == {"ours", "row_by_row", "copy"}
    for method in write["methods"].values():
        assert method["rows"] == SMALL.write_path_documents
    assert write["ours_vs_copy"] > 0 and write["ours_vs_row_by_row"] > 0


def test_sandbox_rate_and_run_breakdown_are_reported(small):
    stages = small[0]["stages"]
    ingestion = stages["ingestion"]
    assert ingestion["sandbox"]["requests"] > SMALL.orders  # a Get order each, plus lists
    assert [c["client_threads"] for c in ingestion["sandbox_ceiling"]] == [1, 8]
    assert {"vtex_orders", "vtex_products", "vtex_skus", "vtex_customers"} <= set(
        ingestion["step_seconds"]
    )
    assert ingestion["runs"] == 2 * SMALL.tenants
    assert {"dbt_tenant_models", "customer_predictions", "dbt_tenant_scoring"} <= set(
        stages["analytics"]["step_seconds"]
    )
    # The weekly churn holdout runs after the first build, timed apart; the daily increment
    # does not run it.
    holdout = {"dbt_holdout_summary", "holdout_predictions", "dbt_churn_holdout", "clv_scorecard"}
    assert holdout == set(stages["analytics"]["churn_holdout"]["step_seconds"])
    assert stages["analytics"]["churn_holdout"]["seconds"] > 0
    assert not holdout & set(stages["analytics"]["step_seconds"])
    assert not holdout & set(stages["increment"]["step_seconds"])
    assert "dbt_tenant_scoring" in stages["increment"]["step_seconds"]
    # After the drains, the chain's refresh: analytics and audiences in one run.
    increment = stages["increment"]
    assert list(increment["parts_seconds"]) == [
        "orders_sync",
        "feed_drain",
        "refresh",
        "activation",
    ]
    assert {"dbt_tenant_models", "dbt_audiences"} <= set(increment["step_seconds"])


def test_scaling_names_each_runs_machine_speed(small):
    """Reports of two scales may come from machines of different speeds: the sandbox's
    single-client rate, the same workload everywhere, is beside their costs."""
    report = small[0]
    ceiling = report["stages"]["ingestion"]["sandbox_ceiling"][0]["requests_per_second"]
    faster = json.loads(json.dumps(report))
    faster["stages"]["ingestion"]["sandbox_ceiling"][0]["requests_per_second"] = ceiling * 2
    rows = render_summary([report, faster]).splitlines()
    (speed,) = [row for row in rows if row.startswith("| sandbox Get-order req/s")]
    assert speed.split(" | ")[1:] == [f"{ceiling:,.0f}", f"{ceiling * 2:,.0f} |"]


def test_each_run_has_a_fresh_worker_and_each_stage_names_its_largest(small):
    report, folder = small
    stages = report["stages"]
    assert "largest_run_peak" not in stages["write_path"]  # no Dagster run
    for name in STAGES[1:]:
        peak = stages[name]["largest_run_peak"]
        assert 0 < peak["rss_start_mb"] <= peak["peak_rss_mb"], name
        # The stage's peak covers every run's, sampled or not.
        assert peak["peak_rss_mb"] <= stages[name]["child_peak_rss_mb"], name
        # The workers' server is measured apart: a run worker's figure is the largest run's,
        # give or take what the worker touches after reporting it (pickling, exiting).
        assert stages[name]["worker_server_peak_rss_mb"] > 0, name
        if stages[name]["child_peak_process"] == "run worker":
            assert stages[name]["child_peak_rss_mb"] <= peak["peak_rss_mb"] + 5, name
        # A process per run: no run starts with what earlier runs left (a long-lived worker
        # grew by over 100 MB from run to run).
        low, high = peak["start_rss_range_mb"]
        assert low <= peak["rss_start_mb"] <= high < low + 25, name
    # Only the runs inside the stage: not the churn holdout and single-tenant runs timed apart.
    assert stages["analytics"]["largest_run_peak"]["job"] in {ANALYTICS_JOB, AUDIENCES_JOB}
    assert stages["analytics"]["largest_run_peak"]["runs"] == 2
    assert stages["increment"]["largest_run_peak"]["job"] in {
        ORDERS_SYNC_JOB,
        FEED_SYNC_JOB,
        CHANGES_JOB,
        activation_push.name,
    }
    summary = (folder / "summary.md").read_text()
    assert "The run whose worker peaked highest" in summary
    assert "The server the workers are forked from, which runs nothing, peaked at" in summary


def test_dbt_models_and_tests_are_timed_where_dbt_runs(small):
    report, folder = small
    stages = report["stages"]
    for name in ("analytics", "increment"):
        dbt = stages[name]["dbt"]
        assert dbt["model_seconds"] > 0 and dbt["test_seconds"] > 0, name
        slowest = dbt["slowest"]
        assert [n["seconds"] for n in slowest] == sorted(
            (n["seconds"] for n in slowest), reverse=True
        )
        assert {n["kind"] for n in slowest} <= {"model", "test"}
        assert dbt["model_seconds"] + dbt["test_seconds"] >= sum(n["seconds"] for n in slowest)
        models = {n["node"] for n in slowest if n["kind"] == "model"}
        assert models and models <= DBT_MODELS, name
    assert "dbt" not in stages["ingestion"] and "dbt" not in stages["activation"]
    assert "dbt's own run time" in (folder / "summary.md").read_text()


def test_the_largest_tenants_refresh_alone_is_timed_apart(small):
    report, folder = small
    analytics = report["stages"]["analytics"]
    single = analytics["largest_tenant_refresh"]
    assert single["runs"] == 1 and single["seconds"] > 0
    assert set(single["step_seconds"]) == {
        "dbt_tenant_models",
        "customer_predictions",
        "dbt_tenant_scoring",
    }
    per_tenant = {
        row["tenant_id"]: row["customers"] for row in analytics["clv_vs_lifetimes"]["tenants"]
    }
    assert single["customers"] == max(per_tenant.values()) == per_tenant[single["tenant_id"]]
    assert (
        f"The largest tenant's refresh alone ({single['tenant_id']}"
        in (folder / "summary.md").read_text()
    )


def test_clv_fit_is_compared_with_lifetimes_on_each_tenant(small):
    clv = small[0]["stages"]["analytics"]["clv_vs_lifetimes"]
    assert len(clv["tenants"]) == SMALL.tenants
    assert clv["tenants_compared"] + len(clv["tenants_skipped"]) == SMALL.tenants
    for row in clv["tenants"]:
        if "lifetimes" in row and "params" in row["lifetimes"]:
            assert set(row["ours"]["params"]) == set(row["lifetimes"]["params"])


def test_activation_pushes_then_resyncs_unchanged(small):
    destinations = small[0]["stages"]["activation"]["destinations"]
    assert set(destinations) == {"meta", "google_data_manager"}
    for pushes in destinations.values():
        assert pushes["first_push"]["added"] > 0
        assert pushes["unchanged_resync"]["unchanged"] == pushes["first_push"]["added"]
        assert pushes["unchanged_resync"]["pending"] == 0


def test_activation_confirms_data_manager_members_only_after_the_verdicts(small):
    """Meta confirms on acknowledgement; Data Manager's first push leaves every member pending,
    and the pushes after it confirm them once the sandbox has processed each request, so no
    request's wait is shorter than the sandbox's delay."""
    report, folder = small
    destinations = report["stages"]["activation"]["destinations"]
    assert destinations["meta"]["first_push"]["pending"] == 0
    assert "settling" not in destinations["meta"]
    google = destinations["google_data_manager"]
    settling = google["settling"]
    assert google["first_push"]["pending"] == google["first_push"]["added"]
    assert settling["confirmed"] == google["first_push"]["added"]
    assert settling["requests"] >= google["first_push"]["requests"] > 0
    assert settling["requests_pending"] == 0
    p50, latest = settling["verdict_latency_p50_seconds"], settling["verdict_latency_max_seconds"]
    assert settling["sandbox_processing_seconds"] <= p50 <= latest
    assert "| google_data_manager |" in (folder / "summary.md").read_text()


def test_masterdata_writes_every_tenants_fields_within_the_budget_then_nothing(small):
    """The first write lands every customer's CL fields, paced by each account's budget (the
    sandbox refusing what goes over it); the unchanged re-run writes nothing."""
    report, folder = small
    masterdata = report["stages"]["masterdata"]
    first, rerun = masterdata["first_write"], masterdata["unchanged_rerun"]
    assert first["added"] == first["desired"] > 0 and first["rejected"] == 0
    assert first["patch_requests"] >= first["added"]  # one PATCH each, plus any throttled
    assert first["requests_sent"] > first["patch_requests"]  # the existence searches too
    # Paced: no account sends more than a second's burst over its rate.
    rate = masterdata["client_requests_per_second"]
    assert first["requests_sent"] <= SMALL.tenants * rate * (first["seconds"] + 1)
    assert first["throttled_429"] >= 0
    assert rerun["unchanged"] == first["added"]
    assert (rerun["added"], rerun["removed"], rerun["patch_requests"]) == (0, 0, 0)
    assert "**Master Data write-back**" in (folder / "summary.md").read_text()


def test_targets_are_judged_and_seed_targets_marked_not_applicable(small):
    targets = {row["target"]: row for row in small[0]["targets"]}
    assert len(targets) == 10
    # The freshness stage runs at seed only; the increment's targets are seed's and large's.
    for name in (
        "Order event to the Meta audience, p95 (freshness)",
        "Daily increment at seed, feed included (12,000 orders)",
        "Daily increment at large, feed included (60,000 orders over 5M)",
    ):
        assert not targets[name]["applies"] and targets[name]["met"] is None
    assert "n/a (large target)" in small[1].joinpath("summary.md").read_text()
    assert targets["Write path vs plain COPY"]["met"] in (True, False)
    assert targets["Peak RSS of a run process (run worker or its dbt)"]["met"] in (True, False)


def test_json_markdown_and_chart_are_written(small):
    report, folder = small
    assert json.loads((folder / "small.json").read_text())["scale"] == "small"
    ET.fromstring((folder / "small.svg").read_text())  # well-formed SVG
    summary = (folder / "summary.md").read_text()
    assert "## small" in summary and "small.svg" in summary
    assert "MISSED" in summary or "met" in summary
