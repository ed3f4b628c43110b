"""A run worker for the reliability scenarios: one tenant's materializations in a process of
their own, as Dagster's run launcher starts them, so that a test can SIGKILL the process or run
several at once. Its Dagster storage is the test database (DATABASE_URL), where the test finds
the runs.

    python run_worker.py ingest TENANT PORT FIRST_MONTH   every VTEX asset of the tenant
    python run_worker.py refresh TENANT PORT FIRST_MONTH  the same, every order month re-read
    python run_worker.py month TENANT PORT MONTH          one tenant x month of orders
    python run_worker.py activate TENANT URL GRAPH_URL    the tenant's Meta audiences

PORT is the test's VTEX sandbox; the last line printed holds the ids of the runs made. With
START_GATE set to a folder, the worker (once imported) leaves a file there and waits for a
file named `go`, so that workers start their runs at the same moment.
(Threads would not do: concurrent in-process runs race in CPython 3.11's AST module through
pydantic's docstring parsing, and in logging's `dictConfig` at run start.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg
from support import sync, vtex_for
from support.activation import push

from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.meta.audiences import MetaAudiences
from cdp_assets.activation.meta.resources import MetaResource
from cdp_assets.framework.dagster_storage import storage_config
from cdp_assets.lib.database import sqlalchemy_url
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import order_months, tenants
from cdp_assets.vtex.assets import vtex_orders
from cdp_devkit.sandbox import SandboxProcess, StoreSpec

TESTS = Path(__file__).resolve().parent.parent
RUNS_LINE = "RUNS "
# Meta takes 10,000 rows per request; killed pushes send 250, so an audience of a few
# thousand members goes out in several confirmed batches a kill can fall between.
WORKER_BATCH = 250


def push_audience(
    instance: dg.DagsterInstance, url: str, graph_url: str, tenant_id: str
) -> dg.ExecuteInProcessResult:
    resources = {
        "warehouse": WarehouseResource(url=url),
        "meta": MetaResource(graph_url=graph_url, retry_base_seconds=0.01),
    }
    return push(meta_custom_audiences, instance, tenant_id, resources, {})


def _sandbox(port: str) -> SandboxProcess:
    # A handle on the test's sandbox, for its address: never started here.
    return SandboxProcess([StoreSpec(account="unused")], port=int(port))


def _wait_at_gate(gate: Path) -> None:
    (gate / f"{os.getpid()}.ready").touch()
    while not (gate / "go").exists():
        time.sleep(0.005)


def main(argv: list[str]) -> None:
    command, tenant_id, *rest = argv
    if "START_GATE" in os.environ:
        _wait_at_gate(Path(os.environ["START_GATE"]))
    storage = storage_config(sqlalchemy_url(os.environ["DATABASE_URL"]))
    with dg.instance_for_test(overrides={"storage": storage}) as instance:
        if command in ("ingest", "refresh"):
            port, first_month = rest
            months = (first_month, order_months.get_last_partition_key())
            results = sync(
                instance,
                _sandbox(port),
                tenant_id,
                months=months,
                full_refresh=command == "refresh",
            )
        elif command == "month":
            port, month = rest
            instance.add_dynamic_partitions(tenants.name, [tenant_id])
            key = dg.MultiPartitionKey({"tenant": tenant_id, "month": month})
            resources = {"warehouse": WarehouseResource(), "vtex": vtex_for(_sandbox(port))}
            orders = dg.materialize(
                [vtex_orders], partition_key=key, instance=instance, resources=resources
            )
            results = {"orders": orders}
        else:
            url, graph_url = rest
            MetaAudiences.batch_size = WORKER_BATCH
            results = {"activation": push_audience(instance, url, graph_url, tenant_id)}
    print(RUNS_LINE + json.dumps({name: result.run_id for name, result in results.items()}))


class Worker:
    """`main(args)` running in a new process; its output kept for the test."""

    def __init__(self, *args: str, gate: Path | None = None) -> None:
        self.args = args
        self._output = tempfile.TemporaryFile()  # noqa: SIM115 (closed once the worker ended)
        env = {**os.environ, "PYTHONPATH": str(TESTS)}
        if gate is not None:
            env["START_GATE"] = str(gate)
        self.process = subprocess.Popen(
            [sys.executable, __file__, *args],
            env=env,
            stdout=self._output,
            stderr=self._output,
        )
        self.log = ""

    def _ended(self) -> None:
        self._output.seek(0)
        self.log = self._output.read().decode(errors="replace")
        self._output.close()

    def kill_when(self, due: Callable[[], bool], delay: float, timeout: float = 180) -> bool:
        """SIGKILL the worker `delay` seconds after `due()` first holds; False when it finished
        on its own before that."""
        deadline = time.monotonic() + timeout
        try:
            while self.process.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker {self.args} neither finished nor got killed")
                if due():
                    time.sleep(delay)
                    self.process.send_signal(signal.SIGKILL)
                    break
                time.sleep(0.002)
        finally:
            if self.process.poll() is None:
                self.process.kill()  # already killed, or the test is failing: never leave it
            self.process.wait()
            self._ended()
        assert self.process.returncode in (0, -signal.SIGKILL), self.log[-3000:]
        return self.process.returncode == -signal.SIGKILL

    @staticmethod
    def wait_ready(gate: Path, workers: list[Worker], timeout: float = 180) -> None:
        """Wait until every worker, imported, waits at `gate` (an empty folder)."""
        deadline = time.monotonic() + timeout
        while len(list(gate.glob("*.ready"))) < len(workers):
            ended = [w for w in workers if w.process.poll() is not None]
            if ended or time.monotonic() > deadline:
                for worker in workers:
                    worker.process.kill()
                    worker.process.wait()
                    worker._ended()
                log = (ended or workers)[0].log
                raise RuntimeError(f"workers did not get ready:\n{log[-3000:]}")
            time.sleep(0.01)

    @staticmethod
    def open(gate: Path) -> None:
        """Let the workers waiting at `gate` start their runs, all at the same moment."""
        (gate / "go").touch()

    def runs(self, timeout: float = 180) -> dict[str, str]:
        """Wait for a normal exit; the ids of the runs it made, by entity."""
        try:
            self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._ended()
        assert self.process.returncode == 0, self.log[-3000:]
        (line,) = [line for line in self.log.splitlines() if line.startswith(RUNS_LINE)]
        return json.loads(line.removeprefix(RUNS_LINE))


if __name__ == "__main__":
    main(sys.argv[1:])
