"""Cancellation: a run cancelled while its step waits on VTEX stops, step processes included,
well within the instance's cancel timeout, and the next run of the partition lands everything;
a step deaf to the request is killed by the executor once its grace has passed.

Dagster cancels a run in progress by marking it CANCELING and interrupting its run worker (the
run launcher's `terminate`); the run worker here is a `products_worker` process, and the test
does both. The run's processes (the worker, the forkserver its executor forks steps from, the step
processes) are watched until they are gone.
"""

from __future__ import annotations

import time
from importlib.resources import files

import dagster as dg
import psutil
import pytest
import yaml
from products_worker import STUBBORN_JOB, RunWorker, wait_for
from support import register
from truth import compare

from cdp_devkit.sandbox import SandboxProcess, StoreSpec

STORE = StoreSpec("cancelling", seed=61, customers=50, orders=50, products=40)
CANCEL_TIMEOUT = yaml.safe_load((files("cdp_assets.lib") / "dagster.yaml").read_text())[
    "run_monitoring"
]["cancel_timeout_seconds"]
STUBBORN_GRACE = 2.0


@pytest.fixture(scope="module")
def sandbox():
    with SandboxProcess([STORE]) as server:
        yield server


def gone_within(processes: list[psutil.Process], timeout: float) -> float:
    """Seconds until every process has ended (reaped or not); the survivors are killed and
    the test fails when that takes longer than `timeout`."""
    started = time.monotonic()

    def ended() -> bool:
        return all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in processes)

    try:
        wait_for("every process of the run ended", ended, timeout)
    finally:
        for process in processes:
            if process.is_running():
                process.kill()
    return time.monotonic() - started


def stepping(instance: dg.DagsterInstance, worker: RunWorker) -> bool:
    run = worker.run(instance)
    return run is not None and any(
        entry.dagster_event is not None and entry.dagster_event.is_step_start
        for entry in instance.all_logs(run.run_id)
    )


@pytest.mark.timeout(400)
def test_a_cancelled_run_stops_with_its_steps_and_the_next_run_lands_all(
    conn, instance, sandbox, reliability_report
):
    """The step waits on product details dripped a byte a second: without deadlines they would
    take an hour each, and the step would outlive its run."""
    register(conn, "cancel_drip", STORE.account)
    sandbox.set_faults({"drip": {"get_product": 1.0}})
    try:
        worker = RunWorker(sandbox, "cancel_drip")
        drips = wait_for(
            "details dripping",
            lambda: sandbox.stats()["accounts"][STORE.account]["faults"].get("drip", 0) >= 8,
            timeout=180,
        )
        processes = worker.processes()
        assert len(processes) >= 3, processes  # the worker, the forkserver, the step
        worker.cancel(instance)
        seconds = gone_within(processes, CANCEL_TIMEOUT)
        worker.finish(timeout=10)
    finally:
        sandbox.clear_faults()
    cancelled = instance.get_run_by_id(worker.run(instance).run_id)
    assert cancelled.status == dg.DagsterRunStatus.CANCELED

    again = RunWorker(sandbox, "cancel_drip")
    assert again.finish(timeout=180) == 0
    assert again.run(instance).status == dg.DagsterRunStatus.SUCCESS
    comparison = compare(conn, sandbox, "cancel_drip", STORE.account, entities=("products",))
    reliability_report.record(
        "cancellation: a run cancelled while VTEX drips its answers",
        faults=f"details dripped 1 byte/s; cancelled, every process gone in {seconds:.1f} s"
        f" (cancel timeout {CANCEL_TIMEOUT} s); the next run landed everything",
        checked=comparison.checked,
        lost=comparison.lost,
        duplicates=comparison.duplicates,
        passed=comparison.exact and seconds < CANCEL_TIMEOUT and bool(drips),
    )
    assert comparison.exact, comparison


@pytest.mark.timeout(300)
def test_a_step_deaf_to_the_cancel_is_killed_after_its_grace(instance, sandbox):
    worker = RunWorker(
        sandbox,
        "cancel_deaf",
        WORKER_JOB=STUBBORN_JOB,
        CDP_STEP_STOP_GRACE_SECONDS=str(STUBBORN_GRACE),
    )
    wait_for("the step started", lambda: stepping(instance, worker), timeout=180)
    time.sleep(1)  # into its sleep, interrupts blocked
    processes = worker.processes()
    worker.cancel(instance)
    seconds = gone_within(processes, timeout=60)
    worker.finish(timeout=10)
    assert STUBBORN_GRACE <= seconds < 30
    assert worker.run(instance).is_finished
