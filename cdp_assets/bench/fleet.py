"""`cdp bench --scale fleet`: the control plane at many tenants, with a year of history.

For 41 tenants and then 400, in a database of its own: the tenants registered (stores never
synced: what is measured is the control plane, not ingestion) and a year of their
materializations seeded into the Dagster instance (the orders twice a day, every other watched
asset daily; `seed_history`). Then, against that instance:

- `cdp status --check`: the first call, which reads the whole history into the partition state
  once, and the next, the steady cost (`ops/partition_state.py`);
- the orders schedule's tick through Dagster's scheduler code (`launch_scheduled_runs`, what
  the daemon calls): evaluating the schedule and creating a queued run per tenant;
- the UI's partition-health query for `vtex_orders` (the asset page's GraphQL), on a fresh
  workspace, in process.

Writes `fleet.json` into the results folder.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
from click.testing import CliRunner
from dagster._core.events import DagsterEvent, StepMaterializationData
from dagster._core.events.log import EventLogEntry
from dagster._core.instance.utils import RUNLESS_JOB_NAME, RUNLESS_RUN_ID
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._scheduler.scheduler import launch_scheduled_runs
from dagster._serdes import serialize_value
from dagster._utils.schedules import cron_string_iterator
from dagster_graphql.test.utils import execute_dagster_graphql

from cdp_assets.bench.measure import rss_mb
from cdp_assets.lib.database import database_url, sqlalchemy_url, with_database
from cdp_assets.lib.warehouse import migrated_url
from cdp_assets.partitions import month_start
from cdp_assets.tenants.registry import Tenant, add_tenant

FLEET_SIZES = (41, 400)
HISTORY_DAYS = 365
LOCATION, REPOSITORY = "cdp", "__repository__"
ORDERS_SCHEDULE = "vtex_orders_twice_daily"
CREDENTIAL_REFS = ("CDP_FLEET_APP_KEY", "CDP_FLEET_APP_TOKEN")  # sandbox values, not secrets
TARGETS = {  # at 400 tenants, seconds
    "status_check_seconds": 3.0,
    "orders_schedule_tick_seconds": 10.0,
    "partition_health_seconds": 2.0,
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


def fleet_tenant_id(rank: int) -> str:
    return f"fleet{rank + 1:03d}"


def _materialization(key: dg.AssetKey, partition: str, timestamp: float) -> EventLogEntry:
    event = DagsterEvent(
        event_type_value=dg.DagsterEventType.ASSET_MATERIALIZATION.value,
        job_name=RUNLESS_JOB_NAME,
        event_specific_data=StepMaterializationData(
            dg.AssetMaterialization(key, partition=partition)
        ),
    )
    return EventLogEntry(
        error_info=None,
        level=logging.INFO,
        user_message="",
        run_id=RUNLESS_RUN_ID,
        timestamp=timestamp,
        dagster_event=event,
        job_name=RUNLESS_JOB_NAME,
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
            template = serialize_value(_materialization(key, PARTITION_SLOT, TIMESTAMP_SLOT))
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
            instance.event_log_storage.store_event_batch([_materialization(key, *newest)])
            stored += len(history)
    return stored


@contextmanager
def _fleet_instance(tenants: int, echo: Callable[[str], None]) -> Iterator[tuple[str, Any]]:
    """A database and a Dagster instance (the platform's dagster.yaml) of their own, with
    `tenants` registered; dropped afterwards."""
    from cdp_assets.demo import sync_tenant_partitions

    saved = dict(os.environ)
    server = database_url()
    name = f"cdp_bench_fleet{tenants}_{uuid.uuid4().hex[:8]}"
    url = with_database(server, name)
    home = Path(tempfile.mkdtemp(prefix="cdp-fleet-"))
    try:
        migrated_url(url)
        os.environ["DATABASE_URL"] = url
        os.environ["DAGSTER_HOME"] = str(home)
        os.environ["CDP_DAGSTER_PG_URL"] = sqlalchemy_url(url)
        for ref in CREDENTIAL_REFS:
            os.environ[ref] = f"fleet-{ref.lower()}"
        with (files("cdp_assets.lib") / "dagster.yaml").open("rb") as source:
            (home / "dagster.yaml").write_bytes(source.read())
        with dg.DagsterInstance.get() as instance, psycopg.connect(url) as conn:
            for rank in range(tenants):
                tenant = fleet_tenant_id(rank)
                add_tenant(conn, Tenant(tenant, tenant, *CREDENTIAL_REFS, priority=rank))
            conn.commit()
            sync_tenant_partitions(instance, conn)
            echo(f"fleet: {tenants} tenants registered in {name}")
            yield url, instance
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(home, ignore_errors=True)
        with psycopg.connect(with_database(server, "postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def _workspace(instance: dg.DagsterInstance) -> Iterator[WorkspaceProcessContext]:
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="cdp_assets.definitions"), location_name=LOCATION
    )
    target = InProcessWorkspaceLoadTarget(origin)
    with create_test_daemon_workspace_context(target, instance) as context:
        yield context


def _timed(action: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = action()
    return round(time.perf_counter() - started, 3), result


def _status_check(instance: dg.DagsterInstance) -> dict[str, Any]:
    from cdp_assets.cli import main

    seconds, result = _timed(
        lambda: CliRunner().invoke(
            main, ["status", "--check", "--json"], obj={"dagster_instance": instance}
        )
    )
    problems = json.loads(result.output)["problems"] if result.output.startswith("{") else None
    return {"seconds": seconds, "exit_code": result.exit_code, "problems": len(problems or [])}


def _orders_schedule_tick(context: WorkspaceProcessContext) -> dict[str, Any]:
    """One tick of the orders schedule as the daemon runs it (on by default): the scheduler
    run a minute before the schedule's next cron time, then just after it, which ticks."""
    instance = context.instance
    location = context.create_request_context().get_code_location(LOCATION)
    schedule = location.get_repository(REPOSITORY).get_schedule(ORDERS_SCHEDULE)
    now = datetime.now(UTC)
    due = next(
        cron_string_iterator(now.timestamp(), schedule.cron_schedule, schedule.execution_timezone)
    ).astimezone(UTC)
    logger = logging.getLogger("fleet.scheduler")

    def scheduler_until(end: datetime) -> None:
        list(launch_scheduled_runs(context, logger, end_datetime_utc=end, iteration_times={}))

    scheduler_until(due - timedelta(minutes=1))
    runs_before = instance.get_runs_count()
    seconds, _ = _timed(lambda: scheduler_until(due + timedelta(seconds=1)))
    return {"seconds": seconds, "runs_created": instance.get_runs_count() - runs_before}


def _partition_health(context: WorkspaceProcessContext) -> dict[str, Any]:
    seconds, result = _timed(
        lambda: execute_dagster_graphql(
            context.create_request_context(),
            PARTITION_HEALTH,
            {"assetKey": {"path": ["vtex_orders"]}},
        )
    )
    node = (result.data or {}).get("assetNodeOrError") or {}
    return {"seconds": seconds, "partition_stats": node.get("partitionStats")}


def measure_fleet(tenants: int, echo: Callable[[str], None]) -> dict[str, Any]:
    from cdp_assets.ops.status import watched_assets

    keys = sorted({k for ks in watched_assets().values() for k in ks}, key=str)
    with _fleet_instance(tenants, echo) as (url, instance):
        seeded_seconds, seeded = _timed(
            lambda: seed_history(
                instance, url, [fleet_tenant_id(r) for r in range(tenants)], keys, datetime.now(UTC)
            )
        )
        echo(f"fleet {tenants}: {seeded:,} materializations seeded in {seeded_seconds:.0f} s")
        first = _status_check(instance)
        steady = _status_check(instance)
        echo(
            f"fleet {tenants}: cdp status --check {first['seconds']} s first,"
            f" {steady['seconds']} s next"
        )
        with _workspace(instance) as context:
            health = _partition_health(context)
            echo(f"fleet {tenants}: partition health query {health['seconds']} s cold")
            tick = _orders_schedule_tick(context)
            echo(
                f"fleet {tenants}: orders schedule tick {tick['seconds']} s,"
                f" {tick['runs_created']} runs"
            )
        return {
            "tenants": tenants,
            "history_days": HISTORY_DAYS,
            "materializations_seeded": seeded,
            "seed_seconds": seeded_seconds,
            "status_check_first": first,
            "status_check": steady,
            "partition_health": health,
            "orders_schedule_tick": tick,
            "bench_process_rss_mb": round(rss_mb(), 1),
        }


def run_fleet(output: Path, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure every fleet size and write `fleet.json` into `output`; returns the report."""
    started_at = datetime.now(UTC)
    sizes = [measure_fleet(tenants, echo) for tenants in FLEET_SIZES]
    largest = sizes[-1]
    values = {
        "status_check_seconds": largest["status_check"]["seconds"],
        "orders_schedule_tick_seconds": largest["orders_schedule_tick"]["seconds"],
        "partition_health_seconds": largest["partition_health"]["seconds"],
    }
    report = {
        "scale": "fleet",
        "started_at": started_at.isoformat(timespec="seconds"),
        "sizes": sizes,
        "targets": [
            {"target": name, "value": values[name], "limit": limit, "met": values[name] < limit}
            for name, limit in TARGETS.items()
        ],
    }
    output.mkdir(parents=True, exist_ok=True)
    path = output / "fleet.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    echo(f"wrote {path}")
    return report
