"""Dagster's own processes as the tests start them: the webserver and the daemon on the test
database (as `cdp dev` starts them), optionally a gRPC code server they load the code location
from, and the GraphQL the UI itself sends to drive them.

Used by tests/test_ui.py, tests/test_grpc_code_location.py and
tests/framework/test_celery_executor.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import grpc
import psycopg
import pytest
import requests
from grpc_health.v1 import health_pb2
from grpc_health.v1.health_pb2_grpc import HealthStub

from cdp_assets.analytics.dbt_project import ensure_manifest
from cdp_assets.lib.dagster_home import apply_pool_limits, prepare_dagster_home
from cdp_assets.lib.database import sqlalchemy_url, with_database
from cdp_assets.partitions import tenants
from cdp_devkit.sandbox import SandboxProcess
from support import TABLES

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEFINITIONS_MODULE = "cdp_assets.definitions"
LOCATION, REPOSITORY = "cdp", "__repository__"  # workspace.yaml's location; Definitions' repo
RUN_TIMEOUT = 180.0

# What the UI sends (dagster-webserver 1.13's bundle: LaunchAssetExecutionButton.tsx,
# ScheduleMutations.tsx, SensorMutations.tsx).
LAUNCH_PIPELINE_EXECUTION = """
mutation LaunchPipelineExecution($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { id runId pipelineName status } }
    ... on PipelineNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on PythonError { message stack }
  }
}
"""
WORKSPACE = """
query Workspace {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on RepositoryLocation { repositories { name } }
          ... on PythonError { message stack }
        }
      }
    }
    ... on PythonError { message }
  }
}
"""
INSTIGATORS = """
query Instigators($selector: RepositorySelector!) {
  repositoryOrError(repositorySelector: $selector) {
    __typename
    ... on Repository {
      schedules { name scheduleState { id status } }
      sensors { id name sensorState { status } }
    }
  }
}
"""
STOP_SCHEDULE = """
mutation StopSchedule($id: String!) {
  stopRunningSchedule(id: $id) {
    __typename
    ... on ScheduleStateResult { scheduleState { id status } }
    ... on PythonError { message }
  }
}
"""
STOP_SENSOR = """
mutation StopRunningSensor($id: String!) {
  stopSensor(id: $id) {
    __typename
    ... on StopSensorMutationResult { instigationState { id status } }
    ... on PythonError { message }
  }
}
"""
RUN_STATUS = """
query RunStatus($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { id status tags { key value } }
    ... on RunNotFoundError { message }
    ... on PythonError { message }
  }
}
"""
RUN_ERRORS = """
query RunErrors($runId: ID!) {
  logsForRun(runId: $runId) {
    __typename
    ... on EventConnection {
      events {
        __typename
        ... on MessageEvent { message level stepKey }
        ... on ErrorEvent { error { message } }
      }
    }
  }
}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(what: str, probe: Callable[[], Any], timeout: float, every: float = 1.0) -> Any:
    """Poll `probe` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def start_process(command: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal reaches pytest, not these
        )


def stop_processes(processes: Mapping[str, subprocess.Popen]) -> None:
    """SIGINT (what Ctrl-C sends `cdp dev`'s children), then SIGKILL the process group."""
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 20
    for process in processes.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        # Code servers, run workers and Celery's pool are children, in the process group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def fail_if_exited(processes: Mapping[str, subprocess.Popen], logs: Mapping[str, Path]) -> None:
    for name, process in processes.items():
        if process.poll() is not None:
            tail = logs[name].read_text(errors="replace")[-4000:]
            pytest.fail(f"{name} exited with {process.returncode}; its log ends:\n{tail}")


def drop_database(server: str, name: str) -> None:
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def dagster_storage_database(warehouse_url: str, stack: contextlib.ExitStack) -> str:
    """A new database for Dagster's storage on the warehouse's server, dropped when `stack`
    closes; its postgresql+psycopg2:// URL. Runs other tests left unfinished in the session's
    database (SIGKILLed workers, queued runs) would otherwise hold the run queue's slots."""
    name = f"cdp_dagster_{uuid.uuid4().hex[:8]}"
    server = with_database(warehouse_url, "postgres")
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    stack.callback(drop_database, server, name)
    return sqlalchemy_url(with_database(warehouse_url, name))


def served_keys(sandbox: SandboxProcess, account: str, entity: str) -> set[str]:
    """The keys of the well-formed records the sandbox serves for an account."""
    return {
        str(record["key"]) for record in sandbox.export(account, entity) if not record["malformed"]
    }


def stored_keys(conn: psycopg.Connection, tenant_id: str, entity: str) -> set[str]:
    """The keys landed in raw_vtex.<entity> for a tenant."""
    key = TABLES[entity][0]
    sql = f"SELECT {key} FROM raw_vtex.{entity} WHERE tenant_id = %s"
    return {k for (k,) in conn.execute(sql, (tenant_id,))}


def wait_for_grpc_server(
    port: int, process: subprocess.Popen, log: Path, timeout: float = 120.0
) -> None:
    """Until the code server answers the standard gRPC health check (what Kubernetes probes
    and `dagster api grpc-health-check` ask) as SERVING."""

    def serving() -> bool:
        fail_if_exited({"code server": process}, {"code server": log})
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            request = health_pb2.HealthCheckRequest(service="DagsterApi")
            with contextlib.suppress(grpc.RpcError):
                reply = HealthStub(channel).Check(request, timeout=2)
                return reply.status == health_pb2.HealthCheckResponse.SERVING
        return False

    wait_for(f"the code server on port {port}", serving, timeout, every=0.5)


def grpc_server_command(port: int, location: str = LOCATION) -> list[str]:
    """The code location as a gRPC server, as deploy/ runs it."""
    return [
        str(BIN / "dagster"),
        *("api", "grpc", "-m", DEFINITIONS_MODULE, "-h", "127.0.0.1", "-p", str(port)),
        *("--location-name", location),
    ]


@dataclass
class Ui:
    """A running webserver + daemon on the test database, and the sandbox they sync from."""

    url: str
    sandbox: SandboxProcess
    home: Path
    processes: dict[str, subprocess.Popen]
    logs: dict[str, Path]
    http: requests.Session

    def check_alive(self) -> None:
        fail_if_exited(self.processes, self.logs)

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        self.check_alive()
        response = self.http.post(
            f"{self.url}/graphql", json={"query": query, "variables": variables or {}}, timeout=60
        )
        body = response.json()
        assert response.ok and not body.get("errors"), f"GraphQL {response.status_code}: {body}"
        return body["data"]

    def wait_for(self, what: str, probe: Callable[[], Any], timeout: float, every: float = 1.0):
        return wait_for(what, probe, timeout, every)

    def run_errors(self, run_id: str) -> str:
        logs = self.graphql(RUN_ERRORS, {"runId": run_id})["logsForRun"]
        lines = [
            (event.get("error") or {}).get("message") or event.get("message", "")
            for event in logs.get("events", [])
            if event.get("level") == "ERROR" or event.get("error")
        ]
        return "\n".join(lines)[-4000:]

    def wait_for_run(self, run_id: str, timeout: float = RUN_TIMEOUT) -> dict[str, Any]:
        def finished() -> dict[str, Any] | None:
            run = self.graphql(RUN_STATUS, {"runId": run_id})["runOrError"]
            assert run["__typename"] == "Run", run
            return run if run["status"] in ("SUCCESS", "FAILURE", "CANCELED") else None

        run = self.wait_for(f"run {run_id}", finished, timeout)
        errors = "" if run["status"] == "SUCCESS" else self.run_errors(run_id)
        assert run["status"] == "SUCCESS", f"run {run_id} {run['status']}:\n{errors}"
        return run


def wait_until_serving(ui: Ui, location: str = LOCATION, timeout: float = 120.0) -> None:
    def server_info() -> bool:
        ui.check_alive()
        with contextlib.suppress(requests.RequestException):
            return ui.http.get(f"{ui.url}/server_info", timeout=2).ok
        return False

    def location_loaded() -> bool:
        workspace = ui.graphql(WORKSPACE)["workspaceOrError"]
        assert workspace["__typename"] == "Workspace", workspace
        (entry,) = [e for e in workspace["locationEntries"] if e["name"] == location]
        loaded = entry["locationOrLoadError"]
        if loaded and loaded["__typename"] == "PythonError":
            stack = "".join(loaded["stack"])
            pytest.fail(f"code location {location!r} failed to load: {loaded['message']}\n{stack}")
        return entry["loadStatus"] == "LOADED" and loaded is not None

    ui.wait_for("/server_info", server_info, timeout, every=0.25)
    ui.wait_for(f"code location {location!r}", location_loaded, timeout, every=0.5)


def stop_instigators(ui: Ui, location: str = LOCATION) -> list[str]:
    """Toggle every schedule and sensor off, as an operator would in the UI. They run by
    default; in a shared test database they would launch runs for other tests' tenants (and
    the 05:00/06:00 Buenos Aires schedules fire whenever the suite happens to cross them)."""
    selector = {"repositoryLocationName": location, "repositoryName": REPOSITORY}
    repo = ui.graphql(INSTIGATORS, {"selector": selector})["repositoryOrError"]
    assert repo["__typename"] == "Repository", repo
    stopped = []
    for schedule in repo["schedules"]:
        if schedule["scheduleState"]["status"] == "RUNNING":
            result = ui.graphql(STOP_SCHEDULE, {"id": schedule["scheduleState"]["id"]})
            assert result["stopRunningSchedule"]["__typename"] == "ScheduleStateResult", result
            stopped.append(schedule["name"])
    for sensor in repo["sensors"]:
        if sensor["sensorState"]["status"] == "RUNNING":
            result = ui.graphql(STOP_SENSOR, {"id": sensor["id"]})
            assert result["stopSensor"]["__typename"] == "StopSensorMutationResult", result
            stopped.append(sensor["name"])
    return stopped


def keep_for_diagnosis(
    target: Path, home: Path, logs: Mapping[str, Path], sandbox_log: str
) -> Path:
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name, log in logs.items():
        if log.exists():
            shutil.copy(log, target / f"{name}.log")
    (target / "sandbox.log").write_text(sandbox_log)
    if home.exists():  # dagster.yaml, and each run's compute logs under storage/
        shutil.copytree(home, target / "dagster_home")
    return target


@contextlib.contextmanager
def running_ui(
    warehouse_url: str,
    workdir: Path,
    sandbox: SandboxProcess,
    tenant_ids: Sequence[str],
    *,
    artifacts: Path,
    workspace: Path = ROOT / "workspace.yaml",
    code_server_port: int | None = None,
    test_failed: Callable[[], bool] = lambda: False,
) -> Iterator[Ui]:
    """The webserver and the daemon on `workspace`, Dagster's storage in a database of its own,
    the tenants' partitions added, every schedule and sensor off. With `code_server_port`, the
    code location first runs as a gRPC server on that port (`workspace` must point at it); its
    run workers are its children, so it gets the same environment as the webserver.

    Everything started is stopped on exit; on a failure (an exception inside the block, or
    `test_failed()`) the logs and DAGSTER_HOME are copied to `artifacts`/failed."""
    started = time.monotonic()
    home = workdir / "dagster_home"
    names = ["code_server"] if code_server_port else []
    logs = {name: workdir / f"{name}.log" for name in [*names, "webserver", "daemon"]}
    processes: dict[str, subprocess.Popen] = {}
    http = requests.Session()
    failed = True
    shutil.rmtree(artifacts / "failed", ignore_errors=True)
    with contextlib.ExitStack() as stack, pytest.MonkeyPatch.context() as env:
        try:
            # Never the user's ~/.cdp/dagster: prepare_dagster_home uses a DAGSTER_HOME
            # that is set, and writes the platform's dagster.yaml there when it has none.
            env.setenv("DAGSTER_HOME", str(home))
            env.setenv("CDP_DAGSTER_PG_URL", "")  # restored after; set by prepare_dagster_home
            prepare_dagster_home(warehouse_url)
            env.setenv("CDP_DAGSTER_PG_URL", dagster_storage_database(warehouse_url, stack))
            env.setenv("VTEX_BASE_URL_TEMPLATE", sandbox.base_url + "/{account}")
            env.setenv("VTEX_REQUESTS_PER_SECOND", "5000")
            # Here, before any server starts: creating Dagster's tables and parsing dbt's
            # manifest must not race between the servers' code locations.
            with dg.DagsterInstance.get() as instance:
                assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
                apply_pool_limits(instance)
                instance.add_dynamic_partitions(tenants.name, list(tenant_ids))
            ensure_manifest()
            children_env = {**os.environ, "DATABASE_URL": warehouse_url}
            if code_server_port:
                processes["code_server"] = start_process(
                    grpc_server_command(code_server_port), children_env, logs["code_server"]
                )
                wait_for_grpc_server(
                    code_server_port, processes["code_server"], logs["code_server"]
                )
            port = free_port()
            ui = Ui(f"http://127.0.0.1:{port}", sandbox, home, processes, logs, http)
            servers = ["-w", str(workspace)]
            processes["webserver"] = start_process(
                [str(BIN / "dagster-webserver"), *servers, "-h", "127.0.0.1", "-p", str(port)],
                children_env,
                logs["webserver"],
            )
            wait_until_serving(ui)
            stopped = stop_instigators(ui)
            daemon = [str(BIN / "dagster-daemon"), "run", *servers]
            processes["daemon"] = start_process(daemon, children_env, logs["daemon"])
            print(
                f"\nwebserver on {ui.url} after {time.monotonic() - started:.1f} s;"
                f" toggled off {', '.join(stopped)}"
            )
            yield ui
            failed = test_failed()
        finally:
            stop_processes(processes)
            http.close()
            if failed:
                kept = keep_for_diagnosis(artifacts / "failed", home, logs, sandbox._output())
                print(f"\nlogs and DAGSTER_HOME kept in {kept}")
