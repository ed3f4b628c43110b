"""The Dagster UI for real: `dagster-webserver` and `dagster-daemon run` on the test database
(as `cdp dev` starts them), driven through the GraphQL the UI itself sends, and rendered by
headless Chromium.

Screenshots go to tests/artifacts/ui/; when a test fails, the webserver's and the daemon's
logs (and the instance folder, run logs included) are copied to tests/artifacts/ui/failed/.
`CDP_UPDATE_DOCS_SCREENSHOT=1` also rewrites docs/asset-graph.png, the README's picture of the
whole asset graph.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import pytest
import requests
from support import TABLES, register

from cdp_assets.analytics.dbt_project import ensure_manifest
from cdp_assets.lib.dagster_home import apply_pool_limits, prepare_dagster_home
from cdp_assets.lib.database import sqlalchemy_url, with_database
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, tenants
from cdp_assets.sandbox import SandboxProcess, StoreSpec
from cdp_assets.vtex.jobs import TENANT_SYNC_JOB

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts" / "ui"
DOCS_SCREENSHOT = ROOT / "docs" / "asset-graph.png"
BIN = Path(sys.executable).parent

LOCATION, REPOSITORY = "cdp", "__repository__"  # workspace.yaml's location; Definitions' repo
TENANT = "ui_shop"
STORE = StoreSpec(
    account="uishop",
    seed=11,
    customers=200,
    orders=600,
    products=30,
    history_start=date(2025, 6, 1),
)
BACKFILL_MONTHS = ("2025-07-01", "2025-08-01")
RUN_TIMEOUT = 180.0

# What the UI sends (dagster-webserver 1.13's bundle: LaunchAssetExecutionButton.tsx,
# LaunchAssetChoosePartitionsDialog.tsx, ScheduleMutations.tsx, SensorMutations.tsx).
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
LAUNCH_PARTITION_BACKFILL = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PartitionSetNotFoundError { message }
    ... on PartitionKeysNotFoundError { message }
    ... on PipelineNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on UnauthorizedError { message }
    ... on RunConflict { message }
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
BACKFILL_STATUS = """
query BackfillStatus($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill {
      id
      status
      isAssetBackfill
      partitionNames
      error { message }
      runs { id status tags { key value } }
    }
    ... on BackfillNotFoundError { message }
    ... on PythonError { message }
  }
}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Set before the app's own scripts run: no "Join the Dagster community" dialog (the browser half
# of its "Skip"), the navigation collapsed to icons, the lineage drawn top-down.
BROWSER_SETTINGS = {
    "communityNux": "1",
    "dagster-nav-collapsed": True,
    "asset-graph-direction": "vertical",
}
# The error boundary's "Sorry, <region> can't be displayed. Please report this error…", and
# any other visible error.
ERROR_TEXT = re.compile(
    r"Something went wrong|can't be displayed|Please report this error|\bError\b"
)
STILL_LOADING = ("fetching statuses", "Loading")


@dataclass
class Chromium:
    """Headless Chromium driven through the DevTools protocol over a pipe (stdlib only):
    unlike `--screenshot`, it can wait until the page shows what a test expects."""

    profile: Path
    width: int = 1600
    height: int = 1000
    process: subprocess.Popen | None = None
    exceptions: list[str] = field(default_factory=list)

    def __enter__(self) -> Chromium:
        if not os.path.exists(CHROMIUM):
            pytest.fail(
                "chromium is not installed: `apt-get install -y chromium` (.ci/run does it)"
            )
        self.profile.mkdir(parents=True, exist_ok=True)
        self.log = self.profile / "chromium.log"
        log = open(self.log, "wb")  # noqa: SIM115 (closed once chromium has it)
        commands_read, self._commands = os.pipe()
        self._replies, replies_write = os.pipe()

        def on_fds_3_and_4() -> None:  # what --remote-debugging-pipe reads and writes
            read, write = os.dup(commands_read), os.dup(replies_write)
            os.dup2(read, 3)
            os.dup2(write, 4)

        self.process = subprocess.Popen(
            [
                CHROMIUM,
                "--headless=new",
                "--disable-gpu",
                "--no-sandbox",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                f"--user-data-dir={self.profile}",
                f"--window-size={self.width},{self.height}",
                "about:blank",
            ],
            pass_fds=(3, 4),
            preexec_fn=on_fds_3_and_4,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        os.close(commands_read)
        os.close(replies_write)
        log.close()
        self._buffer = b""
        self._id = 0
        self._session: str | None = None
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            attached = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
            self._session = attached["sessionId"]
            self.resize(self.width, self.height)
            self.send("Runtime.enable")
            self.send("Page.enable")
            settings = "".join(
                f"localStorage.setItem({json.dumps(k)}, {json.dumps(json.dumps(v))});"
                for k, v in BROWSER_SETTINGS.items()
            )
            self.send("Page.addScriptToEvaluateOnNewDocument", {"source": settings})
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self.process is not None
        with contextlib.suppress(Exception):
            self._session = None
            self.send("Browser.close", timeout=5)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        os.close(self._commands)
        os.close(self._replies)

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._replies], [], [], remaining)[0]:
                raise TimeoutError(f"chromium did not answer; its log ends:\n{self._log_tail()}")
            chunk = os.read(self._replies, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium exited; its log ends:\n{self._log_tail()}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def send(self, method: str, params: dict | None = None, timeout: float = 30) -> dict:
        self._id += 1
        command: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if self._session:
            command["sessionId"] = self._session
        os.write(self._commands, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            message = self._message(deadline)
            if message.get("method") == "Runtime.exceptionThrown":
                details = message["params"]["exceptionDetails"]
                thrown = details.get("exception", {}).get("description", details.get("text"))
                self.exceptions.append(str(thrown))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def resize(self, width: int, height: int) -> None:
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.send("Emulation.setDeviceMetricsOverride", metrics)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return result["result"].get("value")

    def show(self, url: str, expected: list[str], ready: str = "true", timeout=60.0) -> str:
        """Load `url` and wait until its text shows every `expected` string, nothing is still
        loading and the JavaScript `ready` holds, twice in a row; the visible text. Fails as
        soon as the page shows an error."""
        self.send("Page.navigate", {"url": url})
        deadline = time.monotonic() + timeout
        text, settled = "", 0
        while time.monotonic() < deadline:
            text = self.evaluate("document.body ? document.body.innerText : ''") or ""
            error = ERROR_TEXT.search(text)
            assert not error, f"{url} shows {error.group()!r}:\n{text[:3000]}"
            shown = all(item in text for item in expected)
            loading = any(item in text for item in STILL_LOADING)
            settled = settled + 1 if shown and not loading and self.evaluate(ready) else 0
            if settled == 2:
                return text
            time.sleep(0.5)
        missing = [item for item in expected if item not in text]
        pytest.fail(f"{url}: not ready in {timeout:.0f} s (missing {missing}); it shows:\n{text}")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def dom(self) -> str:
        return self.evaluate("document.documentElement.outerHTML")


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
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = self.logs[name].read_text(errors="replace")[-4000:]
                pytest.fail(f"{name} exited with {process.returncode}; its log ends:\n{tail}")

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        self.check_alive()
        response = self.http.post(
            f"{self.url}/graphql", json={"query": query, "variables": variables or {}}, timeout=60
        )
        body = response.json()
        assert response.ok and not body.get("errors"), f"GraphQL {response.status_code}: {body}"
        return body["data"]

    def wait_for(self, what: str, probe: Callable[[], Any], timeout: float, every: float = 1.0):
        """Poll `probe` until it returns something truthy; that value."""
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(every)

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


def _wait_until_serving(ui: Ui, timeout: float = 120.0) -> None:
    def server_info() -> bool:
        ui.check_alive()
        with contextlib.suppress(requests.RequestException):
            return ui.http.get(f"{ui.url}/server_info", timeout=2).ok
        return False

    def location_loaded() -> bool:
        workspace = ui.graphql(WORKSPACE)["workspaceOrError"]
        assert workspace["__typename"] == "Workspace", workspace
        (entry,) = [e for e in workspace["locationEntries"] if e["name"] == LOCATION]
        loaded = entry["locationOrLoadError"]
        if loaded and loaded["__typename"] == "PythonError":
            stack = "".join(loaded["stack"])
            pytest.fail(f"code location {LOCATION!r} failed to load: {loaded['message']}\n{stack}")
        return entry["loadStatus"] == "LOADED" and loaded is not None

    ui.wait_for("/server_info", server_info, timeout, every=0.25)
    ui.wait_for(f"code location {LOCATION!r}", location_loaded, timeout, every=0.5)


def _stop_instigators(ui: Ui) -> list[str]:
    """Toggle every schedule and sensor off, as an operator would in the UI. They run by
    default; in a shared test database they would launch runs for other tests' tenants (and
    the 05:00/06:00 Buenos Aires schedules fire whenever the suite happens to cross them)."""
    selector = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
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


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal reaches pytest, not these
        )


def _stop(processes: dict[str, subprocess.Popen]) -> None:
    """SIGINT (what Ctrl-C sends `cdp dev`'s children), then SIGKILL the process group."""
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 20
    for process in processes.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        # Code servers and run workers are its children, in its process group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _keep_for_diagnosis(home: Path, logs: dict[str, Path], sandbox_log: str) -> Path:
    target = ARTIFACTS / "failed"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name, log in logs.items():
        if log.exists():
            shutil.copy(log, target / f"{name}.log")
    (target / "sandbox.log").write_text(sandbox_log)
    if home.exists():  # dagster.yaml, and each run's compute logs under storage/
        shutil.copytree(home, target / "dagster_home")
    return target


def _drop_database(server: str, name: str) -> None:
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def ui(warehouse_url: str, tmp_path_factory: pytest.TempPathFactory, request) -> Iterator[Ui]:
    started = time.monotonic()
    failures_before = request.session.testsfailed
    workdir = tmp_path_factory.mktemp("ui")
    home = workdir / "dagster_home"
    logs = {name: workdir / f"{name}.log" for name in ("webserver", "daemon")}
    processes: dict[str, subprocess.Popen] = {}
    http = requests.Session()
    ok = False
    shutil.rmtree(ARTIFACTS / "failed", ignore_errors=True)
    with contextlib.ExitStack() as stack, pytest.MonkeyPatch.context() as env:
        sandbox = stack.enter_context(SandboxProcess([STORE]))
        try:
            with psycopg.connect(warehouse_url) as conn:
                register(conn, TENANT, STORE.account, history_start=STORE.history_start)
            # Never the user's ~/.cdp/dagster: prepare_dagster_home uses a DAGSTER_HOME
            # that is set, and writes the platform's dagster.yaml there when it has none.
            env.setenv("DAGSTER_HOME", str(home))
            env.setenv("CDP_DAGSTER_PG_URL", "")  # restored after; set by prepare_dagster_home
            prepare_dagster_home(warehouse_url)
            # Dagster's storage in a database of its own: runs other tests left unfinished in
            # the session's (SIGKILLed workers, queued runs) would hold the queue's slots.
            storage_db = f"cdp_ui_{uuid.uuid4().hex[:8]}"
            server = with_database(warehouse_url, "postgres")
            with psycopg.connect(server, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{storage_db}"')
            stack.callback(_drop_database, server, storage_db)
            env.setenv(
                "CDP_DAGSTER_PG_URL", sqlalchemy_url(with_database(warehouse_url, storage_db))
            )
            env.setenv("VTEX_BASE_URL_TEMPLATE", sandbox.base_url + "/{account}")
            env.setenv("VTEX_REQUESTS_PER_SECOND", "5000")
            # Here, before any server starts: creating Dagster's tables and parsing dbt's
            # manifest must not race between the webserver's and the daemon's code servers.
            with dg.DagsterInstance.get() as instance:
                assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
                apply_pool_limits(instance)
                instance.add_dynamic_partitions(tenants.name, [TENANT])
            ensure_manifest()
            children_env = {**os.environ, "DATABASE_URL": warehouse_url}
            port = free_port()
            ui = Ui(f"http://127.0.0.1:{port}", sandbox, home, processes, logs, http)
            workspace = ["-w", str(ROOT / "workspace.yaml")]
            processes["webserver"] = _start(
                [str(BIN / "dagster-webserver"), *workspace, "-h", "127.0.0.1", "-p", str(port)],
                children_env,
                logs["webserver"],
            )
            _wait_until_serving(ui)
            stopped = _stop_instigators(ui)
            daemon = [str(BIN / "dagster-daemon"), "run", *workspace]
            processes["daemon"] = _start(daemon, children_env, logs["daemon"])
            print(
                f"\nwebserver on {ui.url} after {time.monotonic() - started:.1f} s;"
                f" toggled off {', '.join(stopped)}"
            )
            yield ui
            ok = request.session.testsfailed == failures_before
        finally:
            _stop(processes)
            http.close()
            if not ok:
                kept = _keep_for_diagnosis(home, logs, sandbox._output())
                print(f"\nwebserver/daemon logs and DAGSTER_HOME kept in {kept}")


def _rows(conn: psycopg.Connection, sql: str, *params: Any) -> list[tuple]:
    return conn.execute(sql, params).fetchall()


def _stored_keys(conn: psycopg.Connection, entity: str, key: str) -> set[str]:
    sql = f"SELECT {key} FROM raw_vtex.{entity} WHERE tenant_id = %s"
    return {k for (k,) in _rows(conn, sql, TENANT)}


def _order_month(order: dict[str, Any]) -> str:
    created = datetime.fromisoformat(order["doc"]["creationDate"].replace("Z", "+00:00"))
    return f"{created.astimezone(UTC):%Y-%m}-01"


# The tests run in this order on purpose: the daemon's backfill loop ticks every 30 s from its
# start, so a backfill launched right after the daemon starts is picked up on the first tick.


def test_a_partition_backfill_launched_like_the_ui_syncs_those_months(ui: Ui, conn) -> None:
    started = time.monotonic()
    keys = [str(dg.MultiPartitionKey({"tenant": TENANT, "month": m})) for m in BACKFILL_MONTHS]
    assert keys[0] == f"{BACKFILL_MONTHS[0]}|{TENANT}"  # dimensions sorted by name
    # The asset's "Materialize…" dialog, launched as a backfill: a pure asset backfill, with
    # the config the dialog's editor can add (one process: the run is over sooner, so the
    # backfill completes a 30 s daemon tick earlier than with a process per step).
    params = {
        "tags": [{"key": "dagster/from_ui", "value": "true"}],
        "assetSelection": [{"path": ["vtex_orders"]}],
        "partitionNames": keys,
        "fromFailure": False,
        "runConfigData": "execution:\n  config:\n    in_process: {}\n",
    }
    launched = ui.graphql(LAUNCH_PARTITION_BACKFILL, {"backfillParams": params})
    result = launched["launchPartitionBackfill"]
    assert result["__typename"] == "LaunchBackfillSuccess", result
    backfill_id = result["backfillId"]

    def finished() -> dict[str, Any] | None:
        backfill = ui.graphql(BACKFILL_STATUS, {"backfillId": backfill_id})
        backfill = backfill["partitionBackfillOrError"]
        assert backfill["__typename"] == "PartitionBackfill", backfill
        return None if backfill["status"] in ("REQUESTED", "CANCELING", "FAILING") else backfill

    backfill = ui.wait_for(f"backfill {backfill_id}", finished, RUN_TIMEOUT, every=1)
    failed = [r["id"] for r in backfill["runs"] if r["status"] != "SUCCESS"]
    errors = "\n".join(ui.run_errors(run_id) for run_id in failed)
    assert backfill["status"] == "COMPLETED_SUCCESS", f"{backfill}\n{errors}"
    assert backfill["isAssetBackfill"] and sorted(backfill["partitionNames"]) == keys
    # BackfillPolicy.multi_run(max_partitions_per_run=24): both months in one run, as a range.
    (run,) = backfill["runs"]
    tags = {t["key"]: t["value"] for t in run["tags"]}
    assert tags[RANGE_START_TAG] == keys[0] and tags[RANGE_END_TAG] == keys[1], tags
    print(f"\nvtex_orders backfill: {time.monotonic() - started:.1f} s from launch to completion")

    truth = {
        str(order["key"])
        for order in ui.sandbox.export(STORE.account, "orders")
        if not order["malformed"] and _order_month(order) in BACKFILL_MONTHS
    }
    stored = _stored_keys(conn, "orders", "order_id")
    assert truth
    assert stored == truth, f"{len(stored)} orders stored, {len(truth)} in those months"


def test_a_tenant_sync_launched_like_the_ui_lands_the_whole_catalog(ui: Ui, conn) -> None:
    started = time.monotonic()
    # The job's launchpad, as it sends a partitioned job: the job selector, the partition as
    # tags, the UI's own tag, the default config (so the default multiprocess executor).
    params = {
        "selector": {
            "repositoryLocationName": LOCATION,
            "repositoryName": REPOSITORY,
            "jobName": TENANT_SYNC_JOB,
        },
        "mode": "default",
        "runConfigData": "{}",
        "executionMetadata": {
            "tags": [
                {"key": "dagster/partition", "value": TENANT},
                {"key": "dagster/partition_set", "value": f"{TENANT_SYNC_JOB}_partition_set"},
                {"key": "dagster/from_ui", "value": "true"},
            ]
        },
    }
    launched = ui.graphql(LAUNCH_PIPELINE_EXECUTION, {"executionParams": params})
    result = launched["launchPipelineExecution"]
    assert result["__typename"] == "LaunchRunSuccess", result
    assert result["run"]["status"] == "QUEUED"  # the daemon's run queue starts it
    run = ui.wait_for_run(result["run"]["id"])
    assert {"key": "dagster/partition", "value": TENANT} in run["tags"]
    print(f"\nvtex_tenant_sync run: {time.monotonic() - started:.1f} s from launch to SUCCESS")

    for entity in ("products", "skus", "customers"):
        truth = {
            str(record["key"])
            for record in ui.sandbox.export(STORE.account, entity)
            if not record["malformed"]
        }
        stored = _stored_keys(conn, entity, TABLES[entity][0])
        assert truth, entity
        assert stored == truth, f"{entity}: {len(stored)} stored, {len(truth)} in the store"


GROUPS = ("vtex", "staging", "intermediate", "marts", "audiences", "activation")
SOME_ASSETS = (
    "vtex_orders",
    "vtex_customers",
    "stg_vtex__orders",
    "int_orders__purchases",
    "rfm_segments",
    "churn_risk",
    "audience_win_back",
    "meta_custom_audiences",
    "google_customer_match",
)
PARTITION_STATS = """
query PartitionStats($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    __typename
    ... on AssetNode { partitionStats { numMaterialized numPartitions } }
  }
}
"""


def test_the_asset_graph_and_a_partitioned_asset_render_in_chromium(ui: Ui, tmp_path) -> None:
    started = time.monotonic()
    # The global lineage, every group open in the sidebar (which the UI keeps in the URL).
    open_groups = "&".join(
        f"open-nodes%5B{i}%5D=global%40global%3A{group}" for i, group in enumerate(GROUPS)
    )
    with Chromium(tmp_path / "chromium", 1600, 1580) as browser:
        # Ready when the graph has drawn a box per group (and their statuses, see STILL_LOADING).
        drawn = "document.querySelectorAll('[data-svg-viewport] svg foreignObject').length"
        text = browser.show(
            f"{ui.url}/asset-groups?{open_groups}",
            [*GROUPS, *SOME_ASSETS],
            ready=f"{drawn} >= {len(GROUPS)}",
        )
        assert "Global asset lineage" in text
        graph = browser.screenshot(ARTIFACTS / "asset-graph.png")
        (ARTIFACTS / "asset-graph.html").write_text(browser.dom())
        if os.environ.get("CDP_UPDATE_DOCS_SCREENSHOT"):
            DOCS_SCREENSHOT.parent.mkdir(exist_ok=True)
            shutil.copy(graph, DOCS_SCREENSHOT)

        # The same counts the API gives, e.g. the backfill's 2 months of 83 for 1 tenant.
        node = ui.graphql(PARTITION_STATS, {"assetKey": {"path": ["vtex_orders"]}})
        stats = node["assetNodeOrError"]["partitionStats"]
        materialized = f"Materialized ({stats['numMaterialized']})"
        missing = f"Missing ({stats['numPartitions'] - stats['numMaterialized']})"
        browser.resize(1600, 1000)
        page = f"{ui.url}/assets/vtex_orders?view=partitions"
        text = browser.show(page, ["vtex_orders", "Partitions", TENANT, materialized, missing])
        assert "2025-07-01" in text and "Filter by month" in browser.dom()
        browser.screenshot(ARTIFACTS / "vtex_orders-partitions.png")
        (ARTIFACTS / "vtex_orders-partitions.html").write_text(browser.dom())
        assert not browser.exceptions, browser.exceptions
    print(f"\nchromium: {time.monotonic() - started:.1f} s for two pages")
