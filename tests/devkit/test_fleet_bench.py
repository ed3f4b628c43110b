"""`cdp bench --scale fleet` at a development size: the platform's processes started on the
bench's instance (code server, webserver, daemon), and every target of the fleet judged from
what they recorded."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cdp_assets.cli import main
from cdp_devkit.bench.fleet import TARGETS

TENANTS = 2


def test_the_fleet_bench_reports_every_target_from_the_running_platform(
    warehouse_url, monkeypatch, tmp_path
):
    monkeypatch.setenv("DATABASE_URL", warehouse_url)
    result = CliRunner().invoke(
        main, ["bench", "--scale", "fleet", "--tenants", str(TENANTS), "--output", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "fleet.json").read_text())
    (size,) = report["sizes"]
    assert size["tenants"] == TENANTS

    targets = {row["target"]: row for row in report["targets"]}
    assert set(targets) == set(TARGETS)
    for name, row in targets.items():
        assert row["tenants"] == TENANTS and isinstance(row["value"], int | float), name
        assert f"{name} at {TENANTS} tenants" in result.output

    # The daemon ticked the orders schedule: queued runs over the blocks of tenants (one block
    # here), every tenant's months planned.
    tick = size["orders_schedule_tick"]
    assert tick["status"] == "SUCCESS" and tick["runs_created"] >= 1, tick
    assert tick["tenants_planned"] == TENANTS, tick
    assert 0 < tick["seconds"] < 600
    # The automation ticked before and after the orders runs were queued.
    automation = size["automation"]
    assert len(automation["ticks"]) >= 2 and automation["longest_seconds"] > 0
    # The webserver answered the asset page's health: every tenant's months, none failed.
    stats = size["partition_health"]["partition_stats"]
    assert stats["numPartitions"] % TENANTS == 0 and stats["numFailed"] == 0
    # Every missing month backfilled, in runs of one tenant each, every tenant with a run.
    backfill = size["backfill"]
    assert backfill["tenants_with_runs"] == TENANTS and backfill["runs_over_one_tenant"] == 0
    assert targets["backfill_runs_over_one_tenant"]["met"]
    # Each process was sampled while it ran.
    assert set(size["peak_rss_mb"]) == {"code_server", "webserver", "daemon"}
    assert all(mb > 50 for mb in size["peak_rss_mb"].values())
    assert size["status_check"]["exit_code"] in (0, 1) and size["status_check"]["seconds"] > 0
