"""The benchmark's world: a throwaway database, a Dagster instance stored in it, the VTEX sandbox
in its own process, the Meta and Google sandboxes in another, and the scale's tenants
registered.

Runs go through `execute_in_process` on that instance, as `cdp demo` does: the same jobs,
assets, resources and run storage as production. Each run executes in a run worker process of
its own, RUN_WORKERS at a time, as the platform's run queue runs several at once and its run
launcher starts a process per run: no run inherits the memory another left behind. The
workers are forked from a server that loaded the definitions once, before any stage started,
so a run pays for a fork, not for importing the code location.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import multiprocessing.forkserver
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg

from cdp_assets.framework.executor import PRELOADED
from cdp_assets.lib.dagster_home import apply_pool_limits
from cdp_assets.lib.database import database_url, sqlalchemy_url, with_database
from cdp_assets.lib.migrations import migrated_url
from cdp_assets.ops.metrics import OWN_FIGURES_PER_PARTITION
from cdp_assets.tenants.registry import Tenant, add_tenant
from cdp_assets.vtex.assets import MONTH_FIGURES
from cdp_devkit.bench.measure import peak_rss_mb, rss_mb
from cdp_devkit.bench.scales import Scale
from cdp_devkit.sandbox import SandboxProcess, StoreSpec, history_end_today
from cdp_devkit.sandbox import credentials_for as vtex_credentials
from cdp_devkit.sandbox.platforms import PlatformSandboxes

META_TOKEN = "bench-meta-token"  # what the Meta sandbox accepts; not a real secret
META_TOKEN_REF = "CDP_BENCH_META_TOKEN"
# Google processes a Data Manager request 30 minutes to 24 hours after acknowledging it
# (https://developers.google.com/data-manager/api/devguides/diagnostics), and the platform's
# verdict sensor reads every 30 minutes. The benchmark measures our side of the wait: the
# verdicts read and the members confirmed, behind a processing delay of its own.
GOOGLE_PROCESSING_SECONDS = 0.2
# Dagster's per-event console lines would drown the benchmark's own progress.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
# The run queue runs up to 4 runs at once in `cdp dev` (lib/dagster.yaml) and 12 in a deployment
# (deploy/dagster.yaml); more workers than cores would only measure the machine's contention.
RUN_WORKERS = max(1, min(4, os.cpu_count() or 1))
_STEP_EVENTS = {
    dg.DagsterEventType.STEP_START,
    dg.DagsterEventType.STEP_SUCCESS,
    dg.DagsterEventType.STEP_FAILURE,
}


class BenchError(RuntimeError):
    pass


@dataclass(frozen=True)
class RunOutcome:
    """What a run worker reports of its run. Memory is the worker's: its RSS when the run
    started (what the forked definitions and the instance hold), and its high-water mark
    when the run ended, the run's peak."""

    run_id: str
    seconds: float
    failures: list[str]  # none when the run succeeded
    metadata: dict[str, dict[str, float]]  # asset key -> numeric materialization metadata
    test_seconds: dict[str, float]  # dbt test -> its run time
    rss_start_mb: float
    peak_mb: float


@dataclass
class RunRecord:
    """One Dagster run: its wall time, the time inside its steps, numeric metadata and the
    run worker's memory."""

    job: str
    label: str
    step_seconds: dict[str, float]
    outcome: RunOutcome

    @property
    def run_id(self) -> str:
        return self.outcome.run_id

    @property
    def seconds(self) -> float:
        return self.outcome.seconds

    @property
    def metadata(self) -> dict[str, dict[str, float]]:
        return self.outcome.metadata

    def total(self, key: str, assets: Sequence[str] | None = None) -> float:
        return sum(
            values.get(key, 0)
            for asset, values in self.metadata.items()
            if assets is None or asset in assets
        )


def _numeric_metadata(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, float]]:
    """Numeric metadata per asset. A run over several partitions records one materialization
    per partition: the figures of each partition's own (MONTH_FIGURES of a month of orders,
    the counts of a tenant's feed drain, OWN_FIGURES_PER_PARTITION) are added up; any other
    figure is the whole run's on each of them (or a rate or an age), so the first is kept."""
    by_asset: dict[str, dict[str, float]] = {}
    for event in result.get_asset_materialization_events():
        key = event.asset_key.to_user_string()
        figures = {
            name: value.value
            for name, value in event.materialization.metadata.items()
            if isinstance(getattr(value, "value", None), int | float)
            and not isinstance(value.value, bool)
        }
        if key not in by_asset:
            by_asset[key] = figures
            continue
        if key in OWN_FIGURES_PER_PARTITION:
            own = [name for name, value in figures.items() if isinstance(value, int)]
        else:
            own = list(MONTH_FIGURES)
        for name in own:
            if name in figures:
                by_asset[key][name] = by_asset[key].get(name, 0) + figures[name]
    return by_asset


# What dagster-dbt records of each dbt node's own run time (model or test).
DBT_DURATION = "Execution Duration"


def _test_seconds(result: dg.ExecuteInProcessResult) -> dict[str, float]:
    """The run time of each dbt test the run executed (an asset check), by check name."""
    seconds: dict[str, float] = {}
    for evaluation in result.get_asset_check_evaluations():
        duration = evaluation.metadata.get(DBT_DURATION)
        if duration is not None:
            seconds.setdefault(evaluation.check_name, float(duration.value))
    return seconds


@dataclass(frozen=True)
class RunRequest:
    job_name: str
    label: str
    partition_key: str | None = None
    tags: dict[str, str] | None = None
    asset_selection: Sequence[dg.AssetKey] | None = None
    run_config: dict[str, Any] | None = None  # beside QUIET: e.g. a resource's settings


# The run slots the workers share (RUN_WORKERS): set in each worker when it starts.
_run_slots: Any = None


def _start_worker(log_path: str, environment: dict[str, str], run_slots: Any) -> None:
    """A run worker: this process's environment as it was when the workers started (a
    forkserver started earlier, by another caller in this process, holds an older one),
    dbt's progress (printed on stdout) and Python's warnings to the bench log, the instance
    loaded."""
    global _run_slots
    _run_slots = run_slots
    os.environ.clear()
    os.environ.update(environment)
    sys.stdout = sys.stderr = open(log_path, "a", buffering=1)  # noqa: SIM115 (its whole life)
    _worker_instance()


@functools.cache
def _worker_instance() -> dg.DagsterInstance:
    from cdp_assets.definitions import defs  # noqa: F401 (loaded before the first run)

    return dg.DagsterInstance.get()  # DAGSTER_HOME, set before the workers started


def _execute(request: RunRequest) -> RunOutcome:
    """One run in a worker, once a run slot is free, and the worker's memory around it."""
    with _run_slots:
        return _execute_now(request)


def _execute_now(request: RunRequest) -> RunOutcome:
    from cdp_assets.definitions import defs

    rss_start = rss_mb()
    started = time.perf_counter()
    result = defs.resolve_job_def(request.job_name).execute_in_process(
        instance=_worker_instance(),
        run_config={**QUIET, **(request.run_config or {})},
        raise_on_error=False,
        partition_key=request.partition_key,
        tags=request.tags,
        asset_selection=request.asset_selection,
    )
    seconds = time.perf_counter() - started
    failures = (
        []
        if result.success
        else [e.message for e in result.all_events if e.is_failure and e.message] or ["failed"]
    )
    return RunOutcome(
        result.run_id,
        seconds,
        failures,
        _numeric_metadata(result),
        _test_seconds(result),
        rss_start,
        peak_rss_mb(),
    )


@dataclass
class Runner:
    """Executes jobs of the platform's code location in run workers and records them."""

    instance: dg.DagsterInstance
    workers: ProcessPoolExecutor
    records: list[RunRecord] = field(default_factory=list)

    def run(self, request: RunRequest) -> RunRecord:
        return self.run_all([request])[0]

    def run_all(self, requests: Sequence[RunRequest]) -> list[RunRecord]:
        """The runs, RUN_WORKERS at a time, in the order given (put the longest first)."""
        outcomes = list(self.workers.map(_execute, requests))
        failed = [
            f"{request.job_name} ({request.label}) failed in run {outcome.run_id}:"
            f" {' | '.join(outcome.failures)}"
            for request, outcome in zip(requests, outcomes, strict=True)
            if outcome.failures
        ]
        if failed:
            raise BenchError("; ".join(failed)[:3000])
        records = [
            RunRecord(request.job_name, request.label, self._step_seconds(o.run_id), o)
            for request, o in zip(requests, outcomes, strict=True)
        ]
        self.records += records
        return records

    def _step_seconds(self, run_id: str) -> dict[str, float]:
        started: dict[str, float] = {}
        seconds: dict[str, float] = {}
        for entry in self.instance.all_logs(run_id, of_type=_STEP_EVENTS):
            step = entry.step_key or ""
            if entry.dagster_event_type == dg.DagsterEventType.STEP_START:
                started[step] = entry.timestamp
            elif step in started:
                seconds[step] = seconds.get(step, 0.0) + entry.timestamp - started.pop(step)
        return seconds


def _run_workers(log_path: Path) -> ProcessPoolExecutor:
    """RUN_WORKERS runs at a time, each in a process that runs it and exits, forked from a
    server that has imported the definitions (as the platform's executor forks its steps,
    framework/executor.py). One worker more than there are slots waits, started, for the next
    free slot: a run's start is not delayed by forking its process (0.2 s) after the last
    one ended, as the run launcher's start is not part of a run either."""
    context = multiprocessing.get_context("forkserver")
    # This module too: each worker unpickles its task and initializer from here (0.15 s).
    context.set_forkserver_preload([PRELOADED, __name__])
    workers = ProcessPoolExecutor(
        RUN_WORKERS + 1,
        mp_context=context,
        initializer=_start_worker,
        initargs=(str(log_path), dict(os.environ), context.Semaphore(RUN_WORKERS)),
        max_tasks_per_child=1,
    )
    # The server starts with the first worker: its import is paid here, before any stage, and
    # its warnings go to the log with the workers' own.
    with _stderr_to(log_path):
        workers.submit(time.sleep, 0).result()
    return workers


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """File descriptor 2 appending to `path` meanwhile: a process started now inherits it."""
    saved = os.dup(2)
    try:
        with open(path, "a") as target:
            os.dup2(target.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@dataclass
class Bench:
    """Everything a stage needs."""

    scale: Scale
    url: str
    specs: list[StoreSpec]
    instance: dg.DagsterInstance
    runner: Runner
    sandbox: SandboxProcess
    platforms: PlatformSandboxes  # Meta's, and Google's when the scale pushes there
    echo: Callable[[str], None]
    meta_accounts: dict[str, str]  # tenant -> Meta ad account id

    @property
    def tenant_ids(self) -> list[str]:
        return [spec.account for spec in self.specs]

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.url)


def _instance(home: Path, url: str) -> dg.DagsterInstance:
    """An instance from the platform's own dagster.yaml, storing runs in the bench database."""
    template = files("cdp_assets.lib") / "dagster.yaml"
    with template.open("rb") as source, open(home / "dagster.yaml", "wb") as target:
        shutil.copyfileobj(source, target)
    os.environ["DAGSTER_HOME"] = str(home)
    os.environ["CDP_DAGSTER_PG_URL"] = sqlalchemy_url(url)
    return dg.DagsterInstance.from_config(str(home))


def _register_tenants(conn: psycopg.Connection, specs: Sequence[StoreSpec]) -> None:
    for priority, spec in enumerate(specs):
        key_ref, token_ref = (
            f"VTEX_{spec.account.upper()}_APP_{part}" for part in ("KEY", "TOKEN")
        )
        os.environ[key_ref], os.environ[token_ref] = vtex_credentials(spec.account)
        tenant = Tenant(
            spec.account,
            spec.account,
            key_ref,
            token_ref,
            priority=priority,
            history_start=spec.history_start,
        )
        add_tenant(conn, tenant)
    conn.commit()


@contextlib.contextmanager
def open_bench(
    scale: Scale, echo: Callable[[str], None], log_path: Path, keep_database: bool = False
) -> Iterator[Bench]:
    """Set up the scale's world; on exit stop everything, drop the database (unless kept) and
    restore this process's environment (the pytest session shares it)."""
    from cdp_devkit.demo import sync_tenant_partitions

    saved_environment = dict(os.environ)
    server = database_url()
    name = f"cdp_bench_{scale.name}_{uuid.uuid4().hex[:8]}"
    url = with_database(server, name)
    specs = scale.store_specs(history_end_today())
    try:
        with contextlib.ExitStack() as stack:
            migrated_url(url)
            stack.callback(_drop_database, server, name, keep_database, echo)
            # Resources, dbt and the run storage all find the warehouse through this variable.
            os.environ["DATABASE_URL"] = url
            home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cdp-bench-")))
            instance = stack.enter_context(_instance(home, url))
            started = time.perf_counter()
            sandbox = stack.enter_context(SandboxProcess(specs, startup_timeout=900))
            echo(
                f"VTEX sandbox: {len(specs)} stores generated and serving on {sandbox.base_url}"
                f" in {time.perf_counter() - started:.1f} s"
            )
            os.environ["VTEX_BASE_URL_TEMPLATE"] = sandbox.base_url + "/{account}"
            # The sandbox is ours to load; VTEX's own 100/s limit does not apply on loopback.
            os.environ["VTEX_REQUESTS_PER_SECOND"] = "100000"
            meta_accounts = {spec.account: str(2_000_000_001 + i) for i, spec in enumerate(specs)}
            platforms = stack.enter_context(
                PlatformSandboxes(
                    {META_TOKEN: list(meta_accounts.values())},
                    scale.google,
                    google_processing_seconds=GOOGLE_PROCESSING_SECONDS,
                )
            )
            os.environ["META_GRAPH_URL"] = platforms.meta_graph_url
            os.environ[META_TOKEN_REF] = META_TOKEN
            if platforms.google_address is not None:
                os.environ["GOOGLE_SANDBOX_ADDRESS"] = platforms.google_address
            with psycopg.connect(url) as conn:
                _register_tenants(conn, specs)
                sync_tenant_partitions(instance, conn)
            apply_pool_limits(instance)
            workers = stack.enter_context(_run_workers(log_path))
            yield Bench(
                scale,
                url,
                specs,
                instance,
                Runner(instance, workers),
                sandbox,
                platforms,
                echo,
                meta_accounts,
            )
    finally:
        os.environ.clear()
        os.environ.update(saved_environment)
        # The forkserver started for the workers holds the bench's environment (its database,
        # its sandboxes); a caller after us, such as the platform's executor in the same pytest
        # session, would fork its steps from it. Stopped, the next one starts with this one.
        multiprocessing.forkserver._forkserver._stop()


def _drop_database(server: str, name: str, keep: bool, echo: Callable[[str], None]) -> None:
    if keep:
        echo(f"kept database {name}")
        return
    with psycopg.connect(with_database(server, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
