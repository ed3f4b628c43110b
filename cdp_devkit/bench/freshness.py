"""Stage 6 (scale seed): freshness, from an order event in a store to the Meta audience.

With the orders feed on for every tenant, the seed's daily increment (new orders and status
changes) is created in the sandbox stores at an even pace, one day's worth in 30 minutes, for
a window of 30 minutes (`CDP_BENCH_FRESHNESS_MINUTES`: a shorter one for a smoke run), while
Dagster's own daemon runs the platform's sensors, automation and run queue on the bench's
instance: nothing is launched by hand, and no schedule runs (`stop_schedules`). Then each
event is followed through what the platform recorded:

- landed: when its order's row in raw_vtex.orders first held a change made at or after the
  event (its lastChange), as seen each slice: an order changed twice lands twice, and the
  row keeps only the second landing;
- refreshed: the end of the first audience refresh of its tenant whose run started after it
  landed (a run reads what landed before it started);
- at the platform: the end of the first Meta push of the tenant that started after that
  refresh, unless the tenant's next refresh ended first (the refresh changed no membership
  Meta holds, so nothing was pushed): then the refresh's end. A push that starts only after
  the next refresh is credited to that one, so a push held back that long would be missed.

An event that has not reached the platform by the end of the settling time is reported as
unaccounted, with the step it stopped at.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
from dagster._cli.workspace.cli_target import get_repository_from_cli_opts
from dagster.version import __version__ as dagster_version
from dagster_shared.cli import WorkspaceOpts

from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.push_requests import changed_audiences
from cdp_assets.lib.database import cdp_home
from cdp_devkit.bench.environment import Bench
from cdp_devkit.bench.measure import StageResult, consistency_check, stage

WINDOW_ENV = "CDP_BENCH_FRESHNESS_MINUTES"
WINDOW_MINUTES = 30.0
# Events are created in this many seconds' slices, each tenant's share in each.
SLICE_SECONDS = 10
# After the window, how long the last events may take before they count as unaccounted.
SETTLE_MINUTES = 10.0
SCALES = ("seed",)
RUNS_END_SECONDS = 300
PROJECT_ROOT = Path(__file__).resolve().parents[2]
AUDIENCE_REFRESHED = dg.AssetKey("audience_catalog")
# Dagster's most per query.
RECORDS_PER_PAGE = 10_000

# The sandbox stamps a change at or after the moment it is asked for (the event's creation).
LANDED_SQL = """
SELECT event.n, orders.synced_at
  FROM unnest(%s::int[], %s::text[], %s::text[], %s::timestamptz[])
       AS event (n, tenant_id, order_id, created_at)
  JOIN raw_vtex.orders AS orders
    ON orders.tenant_id = event.tenant_id AND orders.order_id = event.order_id
   AND orders.change_stamp >= event.created_at
"""


@dataclass(frozen=True)
class Event:
    tenant_id: str
    order_id: str
    created_at: datetime
    is_new: bool


def window_minutes() -> float:
    value = os.environ.get(WINDOW_ENV, "").strip()
    if not value:
        return WINDOW_MINUTES
    try:
        minutes = float(value)
    except ValueError:
        raise ValueError(f"{WINDOW_ENV} must be a number of minutes, not {value[:20]!r}") from None
    if minutes <= 0:
        raise ValueError(f"{WINDOW_ENV} must be more than 0")
    return minutes


def slice_share(total: int, index: int, slices: int) -> int:
    """Slice `index`'s part of `total` spread evenly over `slices` (the parts add up)."""
    return total * (index + 1) // slices - total * index // slices


def stop_schedules(instance: dg.DagsterInstance) -> list[str]:
    """Every schedule of the workspace stopped on the bench's instance, as `dagster schedule
    stop` stops one; their names. The window compresses a day's events, not its schedules: a
    daily schedule due in it (seen: the catalog and customers sync of all 41 tenants, due at
    05:00 in Buenos Aires) would load half an hour with a whole day's syncs, and only when the
    bench runs at that hour."""
    with get_repository_from_cli_opts(
        instance=instance,
        version=dagster_version,
        workspace_opts=WorkspaceOpts(workspace=[str(PROJECT_ROOT / "workspace.yaml")]),
        repository_opts=None,
    ) as repository:
        schedules = repository.get_schedules()
        for schedule in schedules:
            instance.stop_schedule(schedule.get_remote_origin_id(), schedule.selector_id, schedule)
    return sorted(schedule.name for schedule in schedules)


@contextmanager
def dagster_daemon(instance: dg.DagsterInstance, log_path: Path) -> Iterator[subprocess.Popen]:
    """The platform's daemon (sensors, automation, run queue) on the bench's
    instance and environment, as `cdp dev` starts it. Once it stops, the runs it launched
    are waited for (up to RUNS_END_SECONDS): they outlive it, and the bench's database with
    them would go first."""
    bin_dir = Path(sys.executable).parent
    with open(log_path, "a") as log:
        daemon = subprocess.Popen(
            [str(bin_dir / "dagster-daemon"), "run", "-w", str(PROJECT_ROOT / "workspace.yaml")],
            cwd=PROJECT_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield daemon
    finally:
        daemon.send_signal(signal.SIGINT)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        deadline = time.monotonic() + RUNS_END_SECONDS
        running = dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
        )
        while instance.get_runs_count(running) and time.monotonic() < deadline:
            time.sleep(1)


def observe_landings(
    conn: psycopg.Connection, events: Sequence[Event], landed: dict[int, datetime]
) -> None:
    """Adds to `landed` (event index -> landing) the events whose change is in their order's
    row now, with that row's landing."""
    waiting = [n for n in range(len(events)) if n not in landed]
    rows = conn.execute(
        LANDED_SQL,
        (
            waiting,
            [events[n].tenant_id for n in waiting],
            [events[n].order_id for n in waiting],
            [events[n].created_at for n in waiting],
        ),
    )
    landed.update(dict(rows.fetchall()))
    conn.commit()


def create_events(
    bench: Bench, minutes: float, daemon: subprocess.Popen, landed: dict[int, datetime]
) -> list[Event]:
    """The seed's daily increment at the pace of one day in WINDOW_MINUTES, created in the
    stores for `minutes` (a shorter window: as many fewer events), slice by slice; the
    landings seen after each slice go to `landed`."""
    factor = minutes / WINDOW_MINUTES
    plan = {
        account: (round(new * factor), round(changed * factor))
        for account, (new, changed) in zip(bench.tenant_ids, bench.scale.increment(), strict=True)
    }
    slices = max(1, round(minutes * 60 / SLICE_SECONDS))
    started = time.monotonic()
    events: list[Event] = []
    with bench.connect() as conn:
        for index in range(slices):
            observe_landings(conn, events, landed)
            time.sleep(max(0.0, started + index * SLICE_SECONDS - time.monotonic()))
            if daemon.poll() is not None:
                raise RuntimeError(f"the Dagster daemon exited ({daemon.returncode}); see its log")
            for account, (new, changed) in plan.items():
                new_now, changed_now = (
                    slice_share(new, index, slices),
                    slice_share(changed, index, slices),
                )
                if not new_now and not changed_now:
                    continue
                at = datetime.now(UTC)
                ids = bench.sandbox.mutate(
                    account, seed=10_000 + index, changed=changed_now, new=new_now, at=at
                )
                events += [
                    Event(account, order_id, at, position >= len(ids) - new_now)
                    for position, order_id in enumerate(ids)
                ]
    return events


def run_spans(instance: dg.DagsterInstance, asset_key: dg.AssetKey, since: datetime):
    """tenant -> [(run start, materialization), ...] of `asset_key` since `since`, by end.

    Of each page only (tenant, run, time) is kept: a push over a range of tenants gives each
    tenant's materialization the run's whole metadata table, so the records themselves,
    re-read every slice, would grow the bench's own memory with every push."""
    records: list[tuple[str, str, float]] = []
    cursor = None
    while True:
        page = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, after_timestamp=since.timestamp()),
            limit=RECORDS_PER_PAGE,
            cursor=cursor,
        )
        records += [
            (record.partition_key, record.run_id, record.timestamp)
            for record in page.records
            if record.partition_key
        ]
        if not page.has_more:
            break
        cursor = page.cursor
    run_ids = list({run_id for _, run_id, _ in records})
    if not run_ids:
        return {}
    starts = {
        run.dagster_run.run_id: run.start_time
        for run in instance.get_run_records(dg.RunsFilter(run_ids=run_ids))
        if run.start_time is not None
    }
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for tenant_id, run_id, timestamp in records:
        if run_id in starts:
            spans[tenant_id].append((starts[run_id], timestamp))
    return {
        tenant_id: sorted(found, key=lambda span: span[1]) for tenant_id, found in spans.items()
    }


def first_after(spans: Sequence[tuple[float, float]], moment: float) -> tuple[float, float] | None:
    """The span that ends first among those that started at or after `moment`."""
    started_after = [span for span in spans if span[0] >= moment]
    return min(started_after, key=lambda span: span[1], default=None)


def at_platform(
    refreshes: Sequence[tuple[float, float]],
    pushes: Sequence[tuple[float, float]],
    landed: float,
    push_pending: bool,
) -> tuple[float | None, float | None]:
    """(refreshed, at the platform) of a change that landed at `landed` (epoch seconds), or
    None where it has not got there. `push_pending`: the tenant's audiences differ from what
    Meta was last sent."""
    refresh = first_after(refreshes, landed)
    if refresh is None:
        return None, None
    refreshed = refresh[1]
    next_refresh = next((end for _, end in refreshes if end > refreshed), None)
    push = first_after(pushes, refreshed)
    if push is not None and (next_refresh is None or push[0] < next_refresh):
        return refreshed, push[1]
    if next_refresh is None and push_pending:
        return refreshed, None
    # Nothing pushed before the next refresh: this one changed no membership Meta holds.
    return refreshed, refreshed


def percentile(values: Sequence[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def account_for(
    bench: Bench, events: list[Event], since: datetime, landed: dict[int, datetime]
) -> dict[str, Any]:
    """Each event's landing (`landed`, completed now), refresh and arrival at the platform;
    the latencies' summary."""
    with bench.connect() as conn:
        observe_landings(conn, events, landed)
        push_pending = {
            tenant_id
            for tenant_id, platforms in changed_audiences(conn).items()
            if "meta" in platforms
        }
    refreshes = run_spans(bench.instance, AUDIENCE_REFRESHED, since)
    pushes = run_spans(bench.instance, meta_custom_audiences.key, since)
    latencies: list[float] = []
    steps: dict[str, list[float]] = defaultdict(list)
    stopped: Counter[str] = Counter()
    for n, event in enumerate(events):
        landed_at = landed.get(n)
        created = event.created_at.timestamp()
        if landed_at is None:
            stopped["not landed"] += 1
            continue
        refreshed, arrived = at_platform(
            refreshes.get(event.tenant_id, []),
            pushes.get(event.tenant_id, []),
            landed_at.timestamp(),
            event.tenant_id in push_pending,
        )
        if refreshed is None:
            stopped["landed, audiences not refreshed since"] += 1
            continue
        if arrived is None:
            stopped["refreshed, push pending"] += 1
            continue
        latencies.append(arrived - created)
        steps["to_land"].append(landed_at.timestamp() - created)
        steps["to_refresh"].append(refreshed - landed_at.timestamp())
        steps["to_push"].append(arrived - refreshed)
    return {
        "events": len(events),
        "accounted": len(latencies),
        "unaccounted": dict(stopped),
        "p50_seconds": _rounded(percentile(latencies, 0.5)),
        "p95_seconds": _rounded(percentile(latencies, 0.95)),
        "max_seconds": _rounded(max(latencies, default=None)),
        "median_step_seconds": {
            step: _rounded(percentile(values, 0.5)) for step, values in steps.items()
        },
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def job_load(runs: Iterable[tuple[str, float, float | None]]) -> dict[str, dict[str, Any]]:
    """Per job, of its runs (job, created, started or None): how many, and the seconds the
    started ones waited from their creation to their start, p50, p95 and max: the run queue,
    then the launcher and the run's process starting."""
    waits: dict[str, list[float]] = defaultdict(list)
    counts: Counter[str] = Counter()
    for job, created, started in runs:
        counts[job] += 1
        if started is not None:
            waits[job].append(started - created)
    return {
        job: {
            "runs": count,
            **{
                f"queue_wait_{name}_seconds": _rounded(value)
                for name, value in (
                    ("p50", percentile(waits[job], 0.5)),
                    ("p95", percentile(waits[job], 0.95)),
                    ("max", max(waits[job], default=None)),
                )
            },
        }
        for job, count in sorted(counts.items())
    }


def runs_by_job(instance: dg.DagsterInstance, since: datetime) -> dict[str, dict[str, Any]]:
    """The runs the daemon launched since `since`, by job (`job_load`): the run queue's load,
    and what each hop of the chain paid for it."""
    return job_load(
        (record.dagster_run.job_name, record.create_timestamp.timestamp(), record.start_time)
        for record in instance.get_run_records(dg.RunsFilter(created_after=since))
    )


def run_freshness(bench: Bench) -> StageResult:
    """The seed's daily events over the window, the daemon running the chain; then each event
    followed to the platform."""
    minutes = window_minutes()
    log_path = cdp_home() / "bench-daemon.log"
    stopped = stop_schedules(bench.instance)
    since = datetime.now(UTC)
    with (
        stage("freshness", bench.url) as result,
        dagster_daemon(bench.instance, log_path) as daemon,
    ):
        landed: dict[int, datetime] = {}
        events = create_events(bench, minutes, daemon, landed)
        deadline = time.monotonic() + SETTLE_MINUTES * 60
        summary = account_for(bench, events, since, landed)
        while summary["accounted"] < summary["events"] and time.monotonic() < deadline:
            time.sleep(SLICE_SECONDS)
            summary = account_for(bench, events, since, landed)
        result.records = len(events)
        result.records_label = "events"
    bench.echo(
        f"  freshness: {summary['accounted']:,} of {summary['events']:,} events at the platform;"
        f" p50 {summary['p50_seconds']} s, p95 {summary['p95_seconds']} s,"
        f" max {summary['max_seconds']} s"
    )
    new = sum(event.is_new for event in events)
    result.details = {
        "window_minutes": minutes,
        "new_orders": new,
        "changed_orders": len(events) - new,
        **summary,
        "runs_by_job": runs_by_job(bench.instance, since),
        "schedules_stopped": stopped,
        "settled_within_seconds": round(
            (datetime.now(UTC) - since - timedelta(minutes=minutes)).total_seconds(), 1
        ),
        "consistency": [
            consistency_check(
                "every event at the platform", summary["events"], summary["accounted"]
            )
        ],
    }
    return result
