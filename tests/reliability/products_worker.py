"""A run worker as Dagster's run launcher starts one: a job of one tenant's `vtex_products` on
the platform's executor (each step in a process forked from a preloaded forkserver), against
the test's VTEX sandbox at WORKER_REQUESTS_PER_SECOND (default: as fast as loopback goes); or
(WORKER_JOB=stubborn_to_cancel) a job whose step blocks the interrupt and sleeps, as code
stuck in a call that never returns would. For the cancellation scenarios (Dagster cancels a run
by interrupting its run worker: SIGINT from the code server, SIGTERM when Kubernetes deletes the
run's pod, which is what the test does to this process) and the shared request budget.

    WORKER_VTEX_PORT=PORT python products_worker.py TENANT ATTEMPT

Its Dagster storage is the test database (DATABASE_URL), where the test finds the run by its
tag `worker_attempt=ATTEMPT`. Settings come from the environment, which the forkserver and the
step processes inherit (their command lines are multiprocessing's).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
import psutil

from cdp_assets.framework.dagster_storage import storage_config
from cdp_assets.framework.executor import multiprocess_forkserver_executor
from cdp_assets.lib.database import sqlalchemy_url
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import tenants
from cdp_assets.vtex.assets import vtex_products
from cdp_assets.vtex.resources import VtexResource
from cdp_devkit.sandbox import SandboxProcess

HERE = Path(__file__).resolve().parent
JOB = "products"
STUBBORN_JOB = "stubborn_to_cancel"
ATTEMPT_TAG = "worker_attempt"
# A detail's deadline well past a test's patience: only a cancellation can end a dripping run.
VTEX = {"timeout_seconds": 60, "deadline_seconds": 600}


@dg.asset(partitions_def=tenants)
def stubborn() -> None:
    """Deaf to the interrupt, and never done."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    time.sleep(3600)


def products_job() -> dg.JobDefinition:
    """The job, rebuilt by name in every process of the run (`dg.reconstructable`)."""
    vtex = VtexResource(
        base_url_template=f"http://127.0.0.1:{os.environ['WORKER_VTEX_PORT']}/{{account}}",
        requests_per_second=float(os.environ.get("WORKER_REQUESTS_PER_SECOND", 5000)),
        **VTEX,
    )
    defs = dg.Definitions(
        assets=[vtex_products, stubborn],
        jobs=[
            dg.define_asset_job(JOB, selection=[vtex_products], partitions_def=tenants),
            dg.define_asset_job(STUBBORN_JOB, selection=[stubborn], partitions_def=tenants),
        ],
        resources={"warehouse": WarehouseResource(), "vtex": vtex},
        executor=multiprocess_forkserver_executor,
    )
    return defs.resolve_job_def(os.environ.get("WORKER_JOB", JOB))


def main(tenant_id: str, attempt: str) -> None:
    storage = storage_config(sqlalchemy_url(os.environ["DATABASE_URL"]))
    with dg.instance_for_test(overrides={"storage": storage}) as instance:
        instance.add_dynamic_partitions(tenants.name, [tenant_id])
        dg.execute_job(
            dg.reconstructable(products_job),
            instance,
            tags={"dagster/partition": tenant_id, ATTEMPT_TAG: attempt},
        )


def wait_for(what: str, probe: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := probe()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not seen within {timeout} s")
        time.sleep(0.1)
    return found


class RunWorker:
    """A `products_worker` process and the run it makes."""

    def __init__(self, sandbox: SandboxProcess, tenant_id: str, **env: str) -> None:
        self.attempt = uuid.uuid4().hex
        self.process = subprocess.Popen(
            [sys.executable, __file__, tenant_id, self.attempt],
            env={
                **os.environ,
                "PYTHONPATH": f"{HERE.parent}{os.pathsep}{HERE}",
                "WORKER_VTEX_PORT": str(sandbox.port),
                **env,
            },
        )

    def run(self, instance: dg.DagsterInstance) -> dg.DagsterRun | None:
        runs = instance.get_runs(dg.RunsFilter(tags={ATTEMPT_TAG: self.attempt}))
        return runs[0] if runs else None

    def processes(self) -> list[psutil.Process]:
        """The worker and every process under it (forkserver, steps, log tailers)."""
        worker = psutil.Process(self.process.pid)
        return [worker, *worker.children(recursive=True)]

    def cancel(self, instance: dg.DagsterInstance) -> None:
        """What Dagster's run launcher does to cancel the run."""
        instance.report_run_canceling(self.run(instance))
        self.process.send_signal(signal.SIGINT)

    def finish(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()


if __name__ == "__main__":
    main(*sys.argv[1:])
