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
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import pytest
from support import months_ago, register
from support.dagster_services import (
    LAUNCH_PIPELINE_EXECUTION,
    LOCATION,
    REPOSITORY,
    ROOT,
    RUN_TIMEOUT,
    Ui,
    running_ui,
    served_keys,
    stored_keys,
)

from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG
from cdp_assets.vtex.jobs import TENANT_SYNC_JOB
from cdp_devkit.sandbox import SandboxProcess, StoreSpec

ARTIFACTS = ROOT / "tests" / "artifacts" / "ui"
DOCS_SCREENSHOT = ROOT / "docs" / "asset-graph.png"

TENANT = "ui_shop"
STORE = StoreSpec(
    account="uishop",
    seed=11,
    customers=200,
    orders=600,
    products=30,
    history_start=months_ago(18),
)
# Recent enough for the partitions page to show the first without scrolling.
BACKFILL_MONTHS = (months_ago(17).isoformat(), months_ago(16).isoformat())

# What the UI sends (dagster-webserver 1.13's bundle: LaunchAssetChoosePartitionsDialog.tsx).
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


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Set before the app's own scripts run: no "Join the Dagster community" dialog (the browser half
# of its "Skip"), the navigation collapsed to icons, the lineage drawn top-down.
BROWSER_SETTINGS = {
    "communityNux": "1",
    "dagster-nav-collapsed": True,
    "asset-graph-direction": "vertical",
    # The asset boxes' facets: Dagster's defaults, and the owner.
    "asset-node-facets": [
        "unsynced-tag",
        "owner",
        "checks",
        "latest-event",
        "status",
        "kind-tag",
        "automation",
        "partitions",
    ],
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


@pytest.fixture(scope="module")
def ui(warehouse_url: str, tmp_path_factory: pytest.TempPathFactory, request) -> Iterator[Ui]:
    failures_before = request.session.testsfailed
    with SandboxProcess([STORE]) as sandbox:
        with psycopg.connect(warehouse_url) as conn:
            register(conn, TENANT, STORE.account, history_start=STORE.history_start)
        with running_ui(
            warehouse_url,
            tmp_path_factory.mktemp("ui"),
            sandbox,
            [TENANT],
            artifacts=ARTIFACTS,
            test_failed=lambda: request.session.testsfailed != failures_before,
        ) as running:
            yield running


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
    stored = stored_keys(conn, TENANT, "orders")
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
        truth = served_keys(ui.sandbox, STORE.account, entity)
        stored = stored_keys(conn, TENANT, entity)
        assert truth, entity
        assert stored == truth, f"{entity}: {len(stored)} stored, {len(truth)} in the store"


GROUPS = (
    "tenants",
    "vtex",
    "staging",
    "intermediate",
    "marts",
    "audiences",
    "activation",
    "operations",
)
# Drawn open, each asset with its owner; the other groups as one box each. A window wide
# enough for the UI to draw the assets' details (it draws bare boxes when zoomed out further).
EXPANDED_GROUPS = ("tenants", "vtex", "marts", "activation", "operations")
GRAPH_WINDOW = (2800, 1800)
OWNERS = ("data-engineering", "analytics", "marketing-ops")  # the teams, as the UI shows them
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
    # The global lineage, every group open in the sidebar and EXPANDED_GROUPS open in the graph
    # (the UI keeps both in the URL).
    open_groups = "&".join(
        f"open-nodes%5B{i}%5D=global%40global%3A{group}" for i, group in enumerate(GROUPS)
    )
    expanded = "%2C".join(f"global%40global%3A{group}" for group in EXPANDED_GROUPS)
    with Chromium(tmp_path / "chromium", *GRAPH_WINDOW) as browser:
        # Ready when the graph has drawn a box per group (and their statuses, see STILL_LOADING).
        drawn = "document.querySelectorAll('[data-svg-viewport] svg foreignObject').length"
        text = browser.show(
            f"{ui.url}/asset-groups?{open_groups}&expanded={expanded}",
            [*GROUPS, *SOME_ASSETS, *OWNERS],
            ready=f"{drawn} >= {len(GROUPS)}",
        )
        assert "Global asset lineage" in text
        graph = browser.screenshot(ARTIFACTS / "asset-graph.png")
        (ARTIFACTS / "asset-graph.html").write_text(browser.dom())
        if os.environ.get("CDP_UPDATE_DOCS_SCREENSHOT"):
            DOCS_SCREENSHOT.parent.mkdir(exist_ok=True)
            shutil.copy(graph, DOCS_SCREENSHOT)

        # The same counts the API gives, e.g. the backfill's 2 months of the tenant's.
        node = ui.graphql(PARTITION_STATS, {"assetKey": {"path": ["vtex_orders"]}})
        stats = node["assetNodeOrError"]["partitionStats"]
        materialized = f"Materialized ({stats['numMaterialized']})"
        missing = f"Missing ({stats['numPartitions'] - stats['numMaterialized']})"
        browser.resize(1600, 1000)
        page = f"{ui.url}/assets/vtex_orders?view=partitions"
        text = browser.show(page, ["vtex_orders", "Partitions", TENANT, materialized, missing])
        assert BACKFILL_MONTHS[0] in text and "Filter by month" in browser.dom()
        browser.screenshot(ARTIFACTS / "vtex_orders-partitions.png")
        (ARTIFACTS / "vtex_orders-partitions.html").write_text(browser.dom())
        assert not browser.exceptions, browser.exceptions
    print(f"\nchromium: {time.monotonic() - started:.1f} s for two pages")
