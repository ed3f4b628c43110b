"""`cdp bench`: every stage of the platform measured on a synthetic workload in the sandboxes.

Stages, in order: the ingestion write path against the old way and the COPY limit; ingestion
end to end; analytics (dbt and the CLV fit, with `lifetimes` fitting the same data); activation
(first push and unchanged re-sync per destination); the Master Data write-back (every
tenant's CL fields written, then an unchanged re-run, within each account's request budget
that the sandbox enforces); the daily increment from new and changed
orders in the sandbox (the List sync and the orders feed) to pushed audiences; at seed,
freshness: each order event followed to the Meta audience while Dagster's daemon runs the
chain (`CDP_BENCH_FRESHNESS_MINUTES`, 30 by default). Results: `<scale>.json`, `<scale>.svg`
and `summary.md`.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psycopg

from cdp_assets.lib.database import cdp_home
from cdp_devkit.bench import freshness
from cdp_devkit.bench.environment import RUN_WORKERS, open_bench
from cdp_devkit.bench.pipeline import (
    run_activation,
    run_analytics,
    run_increment,
    run_ingestion,
    run_masterdata,
)
from cdp_devkit.bench.report import consistency_checks, judge_targets, write_report
from cdp_devkit.bench.scales import SCALES, Scale
from cdp_devkit.bench.write_path import describe_connection, run_write_path

__all__ = ["SCALES", "run_bench"]

STAGES = (
    run_write_path,
    run_ingestion,
    run_analytics,
    run_activation,
    run_masterdata,
    run_increment,
)


def _load_average() -> str:
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


# Server settings that move the numbers: with autovacuum off, nothing but the platform's own
# VACUUM and ANALYZE keeps tables and statistics fresh between stages.
POSTGRES_SETTINGS = ("autovacuum", "shared_buffers", "work_mem", "fsync", "synchronous_commit")


def _environment(url: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name",
                (["server_version", *POSTGRES_SETTINGS],),
            ).fetchall()
        )
    server_version = settings.pop("server_version")
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "run_workers": RUN_WORKERS,
        "load_average_start": _load_average(),
        "postgres_version": server_version,
        "postgres_settings": settings,
        "connection": describe_connection(url),
        "dagster": version("dagster"),
        "dbt": version("dbt-core"),
    }


def _workload(scale: Scale, stages: dict[str, Any]) -> dict[str, Any]:
    skus = next(
        (
            check["expected"]
            for check in stages.get("ingestion", {}).get("consistency", [])
            if check["check"].startswith("SKUs")
        ),
        None,
    )
    return {
        "fraction": scale.fraction,
        "tenants": scale.tenants,
        "customers": scale.customers,
        "orders": scale.orders,
        "products": scale.products,
        "skus": skus,
        "meta_members": scale.meta_members,
        "increment_orders": scale.increment_orders,
        "write_path_documents": scale.write_path_documents,
    }


def run_bench(
    scale_name: str,
    output: Path,
    echo: Callable[[str], None] = print,
    keep_database: bool = False,
    fraction: float = 1.0,
) -> dict[str, Any]:
    """Run every stage at a scale (or a fraction of its history) and write the report into
    `output`; returns the report."""
    scale = SCALES[scale_name]
    if fraction != 1.0:
        scale = scale.reduced(fraction)
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    log_path = cdp_home() / "bench-output.log"
    echo(f"benchmark at scale {scale.name}; dbt output goes to {log_path}")
    stages: dict[str, Any] = {}
    environment: dict[str, Any] = {}
    error = None
    try:
        with open_bench(scale, echo, log_path, keep_database) as bench:
            environment.update(_environment(bench.url))
            for run_stage in STAGES:
                result = run_stage(bench)
                stages[result.name] = result.as_dict()
            if scale.name in freshness.SCALES:
                stages["freshness"] = freshness.run_freshness(bench).as_dict()
    except BaseException as failure:
        # A long run that fails late still reports the stages it measured.
        error = f"{type(failure).__name__}: {failure}"
        raise
    finally:
        environment["load_average_end"] = _load_average()
        report: dict[str, Any] = {
            "scale": scale.name,
            "started_at": started_at.isoformat(timespec="seconds"),
            "wall_seconds": round(time.perf_counter() - started, 1),
            "environment": environment,
            "workload": _workload(scale, stages),
            "stages": stages,
        }
        if error is not None:
            report["error"] = error[:2000]
        report["targets"] = judge_targets(report)
        report["consistency"] = consistency_checks(report)
        if stages:
            for path in write_report(report, output, suffix="" if error is None else ".failed"):
                echo(f"wrote {path}")
    return report
