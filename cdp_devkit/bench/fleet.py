"""`cdp bench --scale fleet`: the control plane at many tenants, with a year of history.

For 41 tenants and then 400 (`--tenants` for other sizes), in a database of its own: the
tenants registered (stores never synced: what is measured is the control plane, not
ingestion) and a year of their materializations seeded into the Dagster instance (the orders
twice a day, every other watched asset daily; `seed_history`). Then the platform runs as
deployed (deploy/): the code location as a gRPC server, `dagster-webserver` and
`dagster-daemon` on that instance, with the daemon's thread settings of deploy/dagster.yaml.
The run queue launches nothing (`max_concurrent_runs: 0`): the runs the daemon creates stay
queued, so what is measured is creating and judging them, not syncing fake stores. And:

- `cdp status --check`, as the operator runs it: the first call, which reads the whole
  history into the partition state once (`ops/partition_state.py`), and one with the daemon
  running, the steady cost;
- the orders schedule's tick as the daemon records it (its tick row, created when the tick
  starts, and the tick's end): the schedule is stored as started just before its latest
  due time, so the daemon ticks it as soon as it starts, creating the queued runs over the
  block of every tenant (10 tenants a run at most), each tenant's months planned;
- the automation sensor's ticks as the daemon records them: the first (no cursor: every
  tenant's analytics judged from scratch) and the next, once the orders runs are queued;
- the peak RSS of the daemon, the webserver and the code server, sampled while they run;
- the UI's partition-health query for `vtex_orders` (the asset page's GraphQL), the first
  the webserver answers;
- a backfill of every missing `vtex_orders` month launched as the UI launches it, and the
  runs the daemon creates for it: each must cover one tenant.

Writes `fleet.json` into the results folder; the targets are judged at the largest size.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import requests
import yaml
from dagster._core.definitions.selector import InstigatorSelector
from dagster._core.events import DagsterEvent, StepMaterializationData
from dagster._core.events.log import EventLogEntry
from dagster._core.instance.utils import RUNLESS_JOB_NAME, RUNLESS_RUN_ID
from dagster._core.remote_origin import (
    GrpcServerCodeLocationOrigin,
    RemoteInstigatorOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.scheduler.instigation import (
    InstigatorState,
    InstigatorStatus,
    InstigatorTick,
    InstigatorType,
    ScheduleInstigatorData,
    TickStatus,
)
from dagster._core.storage.tags import BACKFILL_ID_TAG
from dagster._serdes import serialize_value
from dagster._utils.schedules import reverse_cron_string_iterator
from dagster_shared.serdes.utils import create_snapshot_id

from cdp_assets.lib.database import database_url, sqlalchemy_url, with_database
from cdp_assets.lib.migrations import migrated_url
from cdp_assets.partitions import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    TENANT_RUN_TAG,
    month_start,
    tenant_months,
    tenant_of_partition_key,
)
from cdp_assets.tenants.registry import Tenant, add_tenant
from cdp_assets.vtex.assets import vtex_orders
from cdp_assets.vtex.schedules import vtex_orders_twice_daily

FLEET_SIZES = (41, 400)
HISTORY_DAYS = 365
PROJECT_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LOCATION, REPOSITORY = "cdp", "__repository__"
AUTOMATION_SENSOR = "analytics_automation_sensor"
CREDENTIAL_REFS = ("CDP_FLEET_APP_KEY", "CDP_FLEET_APP_TOKEN")  # sandbox values, not secrets
# Nothing listens there: a sensor or schedule that called VTEX for a fleet tenant would fail
# at once on the loopback instead of reaching the internet.
NO_VTEX = "http://127.0.0.1:9/{account}"
# How long the bench waits for each thing it measures before reporting it missing: the code
# location loading, a tick, the backfill's runs.
LOAD_SECONDS = 300
TICK_SECONDS = 900
BACKFILL_SECONDS = 300
RSS_EVERY_SECONDS = 0.5
# The targets, judged at the largest size measured (the at 400 tenants).
TARGETS = {
    "status_check_seconds": 3.0,
    "orders_schedule_tick_seconds": 10.0,
    "automation_tick_seconds": 10.0,
    "partition_health_seconds": 2.0,
    "daemon_rss_mb": 400.0,
    "backfill_runs_over_one_tenant": 1.0,  # runs spanning tenants: none
}
# What the asset page asks for a two-dimensional asset's health (dagster-webserver 1.13).
PARTITION_HEALTH = """
query PartitionHealth($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      partitionStats { numMaterialized numPartitions numFailed numMaterializing }
      assetPartitionStatuses {
        ... on MultiPartitionStatuses {
          primaryDimensionName
          ranges {
            primaryDimStartKey
            primaryDimEndKey
            secondaryDim {
              ... on DefaultPartitionStatuses { materializedPartitions failedPartitions }
              ... on TimePartitionStatuses { ranges { startKey endKey status } }
            }
          }
        }
      }
    }
  }
}
"""
# What the UI sends to launch a backfill of selected partitions (LaunchAssetChoosePartitions).
LAUNCH_PARTITION_BACKFILL = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}
"""
LOCATION_STATUS = """
query LocationStatus {
  workspaceOrError {
    ... on Workspace { locationEntries { name loadStatus } }
  }
}
"""


def fleet_tenant_id(rank: int) -> str:
    return f"fleet{rank + 1:03d}"


def materialization_event(
    key: dg.AssetKey,
    partition: str,
    timestamp: float,
    run_id: str = RUNLESS_RUN_ID,
    job_name: str = RUNLESS_JOB_NAME,
) -> EventLogEntry:
    """The event log's entry of a materialization of `key` for `partition`, by `run_id` (a
    runless report by default)."""
    event = DagsterEvent(
        event_type_value=dg.DagsterEventType.ASSET_MATERIALIZATION.value,
        job_name=job_name,
        event_specific_data=StepMaterializationData(
            dg.AssetMaterialization(key, partition=partition)
        ),
    )
    return EventLogEntry(
        error_info=None,
        level=logging.INFO,
        user_message="",
        run_id=run_id,
        timestamp=timestamp,
        dagster_event=event,
        job_name=job_name,
    )


# Filled into one serialized event per asset key: the event log's rows without serializing
# millions of events one by one (Dagster's batch write compiles a statement of every value).
PARTITION_SLOT = "__fleet_partition__"
TIMESTAMP_SLOT = 1_000_000_000.25
EVENT_COLUMNS = ("run_id", "event", "dagster_event_type", "timestamp", "asset_key", "partition")


def _history(key: dg.AssetKey, tenant_ids: list[str], now: datetime) -> Iterator[tuple[str, float]]:
    """(partition, timestamp) of a year of materializations, oldest first: orders twice a day
    (the schedule's runs), every other asset daily."""
    orders = key.path == ["vtex_orders"]
    for day in range(HISTORY_DAYS, 0, -1):
        for slot in range(2 if orders else 1):
            moment = now - timedelta(days=day, hours=-12 * slot)
            for tenant in tenant_ids:
                partition = f"{month_start(moment):%Y-%m-%d}|{tenant}" if orders else tenant
                yield partition, moment.timestamp()


def seed_history(
    instance: dg.DagsterInstance,
    url: str,
    tenant_ids: list[str],
    keys: list[dg.AssetKey],
    now: datetime,
) -> int:
    """A year of materializations of `keys` for every tenant; how many. All but the newest
    are copied into the event log in its own row format; the newest of each key goes through
    the event log's batch write, which indexes the asset as Dagster does."""
    stored = 0
    with psycopg.connect(url) as conn:
        for key in keys:
            history = list(_history(key, tenant_ids, now))
            *older, newest = history
            template = serialize_value(materialization_event(key, PARTITION_SLOT, TIMESTAMP_SLOT))
            columns = ", ".join(EVENT_COLUMNS)
            with conn.cursor().copy(f"COPY event_logs ({columns}) FROM STDIN") as copy:
                for partition, timestamp in older:
                    event = template.replace(PARTITION_SLOT, partition).replace(
                        repr(TIMESTAMP_SLOT), repr(timestamp)
                    )
                    at = datetime.fromtimestamp(timestamp, UTC).replace(tzinfo=None)
                    kind = dg.DagsterEventType.ASSET_MATERIALIZATION.value
                    copy.write_row((RUNLESS_RUN_ID, event, kind, at, key.to_string(), partition))
            conn.commit()
            instance.event_log_storage.store_event_batch([materialization_event(key, *newest)])
            stored += len(history)
    return stored


@contextmanager
def _fleet_instance(tenants: int, echo: Callable[[str], None]) -> Iterator[tuple[str, Path]]:
    """A database and a Dagster instance of their own (the platform's dagster.yaml with the
    daemon's settings of deploy/dagster.yaml, and a run queue that launches nothing), with
    `tenants` registered; dropped afterwards. The environment is the instance's meanwhile,
    which the processes started inherit."""
    from cdp_devkit.demo import sync_tenant_partitions

    saved = dict(os.environ)
    server = database_url()
    name = f"cdp_bench_fleet{tenants}_{uuid.uuid4().hex[:8]}"
    url = with_database(server, name)
    home = Path(tempfile.mkdtemp(prefix="cdp-fleet-"))
    try:
        migrated_url(url)
        os.environ.update(
            {
                "DATABASE_URL": url,
                "DAGSTER_HOME": str(home),
                "CDP_DAGSTER_PG_URL": sqlalchemy_url(url),
                "VTEX_BASE_URL_TEMPLATE": NO_VTEX,
            }
        )
        for ref in CREDENTIAL_REFS:
            os.environ[ref] = f"fleet-{ref.lower()}"
        (home / "dagster.yaml").write_text(yaml.safe_dump(_instance_config()))
        with dg.DagsterInstance.get() as instance, psycopg.connect(url) as conn:
            for rank in range(tenants):
                tenant = fleet_tenant_id(rank)
                add_tenant(conn, Tenant(tenant, tenant, *CREDENTIAL_REFS, priority=rank))
            conn.commit()
            sync_tenant_partitions(instance, conn)
        echo(f"fleet: {tenants} tenants registered in {name}")
        yield url, home
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(home, ignore_errors=True)
        with psycopg.connect(with_database(server, "postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _instance_config() -> dict[str, Any]:
    with (files("cdp_assets.lib") / "dagster.yaml").open("rb") as source:
        config = yaml.safe_load(source)
    deployed = yaml.safe_load((PROJECT_ROOT / "deploy" / "dagster.yaml").read_text())
    config["concurrency"]["runs"]["max_concurrent_runs"] = 0
    for daemon in ("schedules", "sensors"):
        config[daemon] = deployed[daemon]
    return config


def _origin(port: int, name: str) -> RemoteInstigatorOrigin:
    """The origin of a schedule or sensor as the daemon loads it from the code server."""
    location = GrpcServerCodeLocationOrigin(host="127.0.0.1", port=port, location_name=LOCATION)
    return RemoteInstigatorOrigin(RemoteRepositoryOrigin(location, REPOSITORY), name)


def _selector_id(name: str) -> str:
    return create_snapshot_id(
        InstigatorSelector(location_name=LOCATION, repository_name=REPOSITORY, name=name)
    )


def _arm_orders_schedule(instance: dg.DagsterInstance, port: int) -> datetime:
    """Store the orders schedule as started a minute before its latest due time: the daemon
    ticks that time as soon as it starts. The due time."""
    schedule = vtex_orders_twice_daily
    due = next(
        reverse_cron_string_iterator(
            time.time(), schedule.cron_schedule, schedule.execution_timezone
        )
    )
    data = ScheduleInstigatorData(schedule.cron_schedule, due.timestamp() - 60)
    origin = _origin(port, schedule.name)
    state = InstigatorState(origin, InstigatorType.SCHEDULE, InstigatorStatus.RUNNING, data)
    instance.add_instigator_state(state)
    return due


def _ticks(instance: dg.DagsterInstance, port: int, name: str) -> list[InstigatorTick]:
    """The instigator's finished ticks, oldest first."""
    ticks = instance.get_ticks(_origin(port, name).get_id(), _selector_id(name), limit=100)
    return sorted((t for t in ticks if t.status != TickStatus.STARTED), key=lambda t: t.tick_id)


def _tick_seconds(url: str, tick: InstigatorTick) -> float:
    """From the tick's row being created (when the daemon started it; a schedule's tick
    carries its due time instead) to its end."""
    with psycopg.connect(url) as conn:
        (created,) = conn.execute(
            "SELECT extract(epoch FROM create_timestamp::timestamptz)::float8"
            " FROM job_ticks WHERE id = %s",
            (tick.tick_id,),
        ).fetchone()
    return round(float(tick.end_timestamp or 0) - created, 3)


def _wait(what: str, probe: Callable[[], Any], timeout: float, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"fleet: no {what} after {timeout:.0f} s")
        time.sleep(every)
    return value


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _Processes:
    """Dagster's processes as deployed, started in the instance's environment, each in a
    process group of its own (their children go with them), and their RSS sampled."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.running: dict[str, subprocess.Popen] = {}
        self.peak_mb: dict[str, float] = {}
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def start(self, name: str, command: Sequence[str]) -> subprocess.Popen:
        with open(self.home / f"{name}.log", "wb") as log:
            process = subprocess.Popen(
                command,
                cwd=PROJECT_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.running[name] = process
        return process

    def check(self) -> None:
        for name, process in self.running.items():
            if process.poll() is not None:
                tail = (self.home / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"fleet: {name} exited with {process.returncode}:\n{tail}")

    def _sample(self) -> None:
        while not self._stop.wait(RSS_EVERY_SECONDS):
            for name, process in list(self.running.items()):
                with suppress(OSError, ValueError):
                    status = Path(f"/proc/{process.pid}/status").read_text()
                    line = next(x for x in status.splitlines() if x.startswith("VmRSS:"))
                    mb = int(line.split()[1]) / 1024
                    self.peak_mb[name] = max(self.peak_mb.get(name, 0.0), round(mb, 1))

    def stop(self) -> None:
        self._stop.set()
        for process in self.running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in self.running.values():
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def _platform(home: Path, echo: Callable[[str], None]) -> Iterator[tuple[_Processes, str, int]]:
    """The code server, the webserver and the daemon on the instance in DAGSTER_HOME; the
    processes, the webserver's URL and the code server's port. The orders schedule is armed
    before the daemon starts."""
    port, web_port = _free_port(), _free_port()
    workspace = home / "workspace.yaml"
    server = {"host": "127.0.0.1", "port": port, "location_name": LOCATION}
    workspace.write_text(yaml.safe_dump({"load_from": [{"grpc_server": server}]}))
    processes = _Processes(home)
    url = f"http://127.0.0.1:{web_port}"
    try:
        processes.start(
            "code_server",
            [
                str(BIN / "dagster"),
                *("api", "grpc", "-m", "cdp_assets.definitions", "-h", "127.0.0.1"),
                *("-p", str(port), "--location-name", LOCATION),
            ],
        )
        processes.start(
            "webserver",
            [str(BIN / "dagster-webserver"), "-w", str(workspace), "-h", "127.0.0.1"]
            + ["-p", str(web_port)],
        )

        def loaded() -> bool:
            processes.check()
            with suppress(requests.RequestException, KeyError, TypeError):
                entries = _graphql(url, LOCATION_STATUS)["workspaceOrError"]["locationEntries"]
                return any(e["name"] == LOCATION and e["loadStatus"] == "LOADED" for e in entries)
            return False

        _wait("code location in the webserver", loaded, LOAD_SECONDS)
        with dg.DagsterInstance.get() as instance:
            due = _arm_orders_schedule(instance, port)
        echo(f"fleet: webserver on {url}; orders schedule armed for {due:%Y-%m-%d %H:%M %Z}")
        processes.start("daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)])
        yield processes, url, port
    finally:
        processes.stop()


def _graphql(url: str, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    response = requests.post(
        f"{url}/graphql", json={"query": query, "variables": variables or {}}, timeout=300
    )
    response.raise_for_status()
    body = response.json()
    if body.get("errors"):
        raise RuntimeError(f"fleet: GraphQL errors: {body['errors']}")
    return body["data"]


def _timed(action: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = action()
    return round(time.perf_counter() - started, 3), result


def _status_check() -> dict[str, Any]:
    """`cdp status --check` as the operator runs it, in the instance's environment."""
    command = [str(BIN / "cdp"), "status", "--check", "--json"]
    seconds, done = _timed(
        lambda: subprocess.run(command, capture_output=True, text=True, timeout=600)
    )
    problems = json.loads(done.stdout)["problems"] if done.stdout.startswith("{") else None
    return {"seconds": seconds, "exit_code": done.returncode, "problems": len(problems or [])}


def _partition_health(url: str) -> dict[str, Any]:
    seconds, data = _timed(
        lambda: _graphql(url, PARTITION_HEALTH, {"assetKey": {"path": ["vtex_orders"]}})
    )
    node = data.get("assetNodeOrError") or {}
    return {"seconds": seconds, "partition_stats": node.get("partitionStats")}


def _orders_schedule_tick(url: str, processes: _Processes, port: int) -> dict[str, Any]:
    with dg.DagsterInstance.get() as instance:

        def ticked() -> list[InstigatorTick]:
            processes.check()
            return _ticks(instance, port, vtex_orders_twice_daily.name)

        (tick, *_) = _wait("orders schedule tick", ticked, TICK_SECONDS)
        planned = [
            partition
            for run_id in tick.run_ids
            for partition in instance.get_asset_partitions_for_run(
                run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED
            ).get(vtex_orders.key, ())
        ]
    return {
        "seconds": _tick_seconds(url, tick),
        "status": tick.status.value,
        "runs_created": len(tick.run_ids),
        "tenants_planned": len({tenant_of_partition_key(p) for p in planned} - {None}),
        "error": tick.error.message if tick.error else None,
    }


def _automation_ticks(url: str, processes: _Processes, port: int, after: float) -> dict[str, Any]:
    """The automation sensor's ticks up to the first that started after `after` (the orders
    runs queued by then), and at least two: on a loaded machine the first tick, the one
    without a cursor, may itself start after `after`. Every tick's seconds, the first's and
    the longest."""
    with dg.DagsterInstance.get() as instance:

        def ticks() -> list[InstigatorTick]:
            processes.check()
            found = _ticks(instance, port, AUTOMATION_SENSOR)
            return found if len(found) >= 2 and any(t.timestamp >= after for t in found) else []

        found = _wait("automation tick after the orders tick", ticks, TICK_SECONDS)
    seconds = [_tick_seconds(url, t) for t in found]
    return {
        "ticks": seconds,
        "first_seconds": seconds[0],
        "longest_seconds": max(seconds),
        "statuses": sorted({t.status.value for t in found}),
    }


def _missing_orders_backfill(url: str, processes: _Processes) -> dict[str, Any]:
    """Every missing `vtex_orders` month of every tenant, launched as the UI launches it;
    the runs the daemon creates for it (queued), each judged by the tenants it covers."""
    orders = dg.AssetKey("vtex_orders")
    with dg.DagsterInstance.get() as instance:
        every = tenant_months.get_partition_keys(dynamic_partitions_store=instance)
        missing = sorted(set(every) - instance.get_materialized_partitions(orders))
        tenants = {tenant_of_partition_key(key) for key in missing}
        params = {
            "assetSelection": [{"path": orders.path}],
            "partitionNames": missing,
            "fromFailure": False,
            "tags": [{"key": "dagster/from_ui", "value": "true"}],
        }
        result = _graphql(url, LAUNCH_PARTITION_BACKFILL, {"backfillParams": params})
        launched = result["launchPartitionBackfill"]
        if launched["__typename"] != "LaunchBackfillSuccess":
            raise RuntimeError(f"fleet: backfill not launched: {launched}")
        backfills = {b.backfill_id for b in instance.get_backfills(limit=len(tenants) + 10)}

        def created() -> list[dg.DagsterRun]:
            processes.check()
            return [
                run
                for run in instance.get_runs(dg.RunsFilter(tags={"dagster/from_ui": "true"}))
                if run.tags.get(BACKFILL_ID_TAG) in backfills
            ]

        # The runs created until every tenant has one, or until BACKFILL_SECONDS.
        started = time.monotonic()
        runs = created()
        while {r.tags.get(TENANT_RUN_TAG) for r in runs} < tenants:
            if time.monotonic() - started > BACKFILL_SECONDS:
                break
            time.sleep(1)
            runs = created()
    covered = {r.tags.get(TENANT_RUN_TAG) for r in runs} & tenants
    return {
        "partitions": len(missing),
        "tenants": len(tenants),
        "backfills": len(backfills),
        "runs": len(runs),
        "tenants_with_runs": len(covered),
        "seconds": round(time.monotonic() - started, 3),
        # None when no run was created: nothing shows the runs keep to one tenant.
        "runs_over_one_tenant": (
            sum(len(_run_tenants(run)) != 1 for run in runs) if runs else None
        ),
    }


def _run_tenants(run: dg.DagsterRun) -> set[str | None]:
    """The tenants a run covers by its partition tags, and its tenant tag."""
    keys = [run.tags.get(k) for k in ("dagster/partition", RANGE_START_TAG, RANGE_END_TAG)]
    return {tenant_of_partition_key(k) for k in keys if k} | {run.tags.get(TENANT_RUN_TAG)}


def measure_fleet(tenants: int, echo: Callable[[str], None]) -> dict[str, Any]:
    from cdp_assets.ops.status import watched_assets

    keys = sorted({k for ks in watched_assets().values() for k in ks}, key=str)
    with _fleet_instance(tenants, echo) as (url, home):
        with dg.DagsterInstance.get() as instance:
            tenant_ids = [fleet_tenant_id(r) for r in range(tenants)]
            seeded_seconds, seeded = _timed(
                lambda: seed_history(instance, url, tenant_ids, keys, datetime.now(UTC))
            )
        echo(f"fleet {tenants}: {seeded:,} materializations seeded in {seeded_seconds:.0f} s")
        first = _status_check()
        echo(f"fleet {tenants}: cdp status --check {first['seconds']} s (first)")
        with ExitStack() as stack:
            processes, web, port = stack.enter_context(_platform(home, echo))
            tick = _orders_schedule_tick(url, processes, port)
            echo(
                f"fleet {tenants}: orders schedule tick {tick['seconds']} s,"
                f" {tick['runs_created']} runs ({tick['status']})"
            )
            automation = _automation_ticks(url, processes, port, after=time.time())
            echo(f"fleet {tenants}: automation ticks {automation['ticks']} s")
            health = _partition_health(web)
            echo(f"fleet {tenants}: partition health query {health['seconds']} s cold")
            steady = _status_check()
            echo(f"fleet {tenants}: cdp status --check {steady['seconds']} s (daemon running)")
            backfill = _missing_orders_backfill(web, processes)
            echo(
                f"fleet {tenants}: backfill of {backfill['partitions']:,} missing months,"
                f" {backfill['runs']} runs, {backfill['runs_over_one_tenant']} over >1 tenant"
            )
            rss = dict(processes.peak_mb)
        echo(f"fleet {tenants}: peak RSS {rss} MB")
        return {
            "tenants": tenants,
            "history_days": HISTORY_DAYS,
            "materializations_seeded": seeded,
            "seed_seconds": seeded_seconds,
            "status_check_first": first,
            "status_check": steady,
            "orders_schedule_tick": tick,
            "automation": automation,
            "partition_health": health,
            "backfill": backfill,
            "peak_rss_mb": rss,
        }


def _target_values(size: dict[str, Any]) -> dict[str, float | None]:
    return {
        "status_check_seconds": size["status_check"]["seconds"],
        "orders_schedule_tick_seconds": size["orders_schedule_tick"]["seconds"],
        "automation_tick_seconds": size["automation"]["longest_seconds"],
        "partition_health_seconds": size["partition_health"]["seconds"],
        "daemon_rss_mb": size["peak_rss_mb"]["daemon"],
        "backfill_runs_over_one_tenant": size["backfill"]["runs_over_one_tenant"],
    }


def run_fleet(
    output: Path,
    echo: Callable[[str], None] = print,
    sizes: Sequence[int] = FLEET_SIZES,
) -> dict[str, Any]:
    """Measure every fleet size and write `fleet.json` into `output`; returns the report."""
    started_at = datetime.now(UTC)
    measured = [measure_fleet(tenants, echo) for tenants in sizes]
    largest = max(measured, key=lambda size: size["tenants"])
    values = _target_values(largest)
    report = {
        "scale": "fleet",
        "started_at": started_at.isoformat(timespec="seconds"),
        "sizes": measured,
        "targets": [
            {
                "target": name,
                "tenants": largest["tenants"],
                "value": values[name],
                "limit": limit,
                "met": values[name] is not None and values[name] < limit,
            }
            for name, limit in TARGETS.items()
        ],
    }
    output.mkdir(parents=True, exist_ok=True)
    path = output / "fleet.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    echo(f"wrote {path}")
    return report
