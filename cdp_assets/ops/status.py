"""`cdp status`: per active tenant and tenant-partitioned asset, when it last succeeded, whether
that is too long ago (`freshness.FRESHNESS`), whether a run failed since, the last error
recorded in `cdp.sync_errors`, and how many runs are queued or in progress; then the operations
metrics (`metrics.py`), the same figures the `operations_metrics` asset records; then whether
the platform itself is alive (`health.py`: the daemon, the schedules and sensors, the
platform's own assets). Together they are the verdict of `cdp status --check` and of the
health endpoint: `Status.problems`, each naming its tenant where it is one tenant's.

What the code location holds (the assets each FRESHNESS name stands for, the schedules and
sensors) is read from its committed surface (`surface.py`), not by loading it: a probe pays for
its queries, not for importing dbt's manifest and the destinations' SDKs.

Everything comes from the Dagster instance the UI uses (its event log and runs) and the
warehouse, so the answer matches what the UI shows. The event log is read past a cursor into
the latest state of each tenant partition (`partition_state.py`), so a call costs what happened
since the last one, not the whole history.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import psycopg

from cdp_assets.activation.destinations import failing_audiences, resting_until
from cdp_assets.activation.history import OpenActivationRun, open_activation_runs
from cdp_assets.lib.ages import format_age
from cdp_assets.lib.dagster_home import prepare_dagster_home
from cdp_assets.lib.sync_state import OrderGaps, order_gaps
from cdp_assets.ops.freshness import FRESHNESS, PLATFORM_FRESHNESS
from cdp_assets.ops.health import (
    Instigator,
    Problem,
    daemon_problems,
    instigator_problems,
    instigators_of,
)
from cdp_assets.ops.metrics import (
    SUBJECTS,
    MetricsReport,
    collect_metrics,
    metrics_json,
    render_metrics,
)
from cdp_assets.ops.partition_state import partition_outcomes
from cdp_assets.ops.surface import read_surface, watched_assets_of, watched_in
from cdp_assets.ops.sync_errors import SyncError, latest_errors
from cdp_assets.tenants.registry import TenantError, list_tenants
from cdp_assets.vtex.resources import VtexResource

IN_PROGRESS = (
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
)
ERROR_WIDTH = 100  # of an error message in the text output; --json has all of it
# Above this many tenants the text output summarizes (`--all`: every tenant's row).
SUMMARY_ABOVE_TENANTS = 20
WORST_TENANTS = 10  # listed with their problems in the summary


@dataclass(frozen=True)
class AssetStatus:
    """One asset (or dbt group) of one tenant."""

    tenant_id: str
    asset: str
    max_age: timedelta
    # The partition judged: the tenant's own, or for orders its latest month materialized.
    partition_key: str | None
    last_success: datetime | None
    stale: bool  # never materialized, or last succeeded more than max_age ago
    # The latest run for it failed after its last success.
    failed_run_id: str | None
    failed_at: datetime | None
    last_error: SyncError | None
    # Orders only, whatever month is judged: orders unread, months unreconciled or failed.
    degraded: str = ""
    # Orders only: months older than VTEX serves, not imported (a note, not a problem).
    unavailable: str = ""

    @property
    def ok(self) -> bool:
        return not self.stale and self.failed_run_id is None and not self.degraded

    @property
    def state(self) -> str:
        problems = []
        if self.last_success is None:
            problems.append("never")
        elif self.stale:
            problems.append("stale")
        if self.failed_run_id is not None:
            problems.append("failed")
        if self.degraded:
            problems.append("degraded")
        return "+".join(problems) or "ok"


@dataclass(frozen=True)
class Status:
    checked_at: datetime
    queued_runs: int
    in_progress_runs: int
    assets: tuple[AssetStatus, ...]
    metrics: MetricsReport
    # The daemon, the schedules and sensors, the platform's own assets.
    platform: tuple[Problem, ...] = ()
    # Destination syncs recorded as running, oldest first (`cdp destinations history`).
    open_syncs: tuple[OpenActivationRun, ...] = ()
    # Destination audiences whose last syncs failed.
    destinations: tuple[Problem, ...] = ()

    @property
    def problems(self) -> list[Problem]:
        """Everything that makes the platform unhealthy, the tenant named where it is one's."""
        found = [*self.platform, *self.destinations]
        for figure in self.metrics.alerting:
            threshold = self.metrics.thresholds[figure.metric].describe()
            tenant = figure.subject if SUBJECTS.get(figure.metric) == "tenant" else None
            found.append(
                Problem(
                    "metric",
                    figure.key,
                    f"{figure.value:.1f}, past its alert threshold ({threshold})",
                    tenant_id=tenant or None,
                )
            )
        for asset in self.assets:
            if not asset.ok:
                found.append(Problem("asset", asset.asset, _what(asset), asset.tenant_id))
        return found

    @property
    def healthy(self) -> bool:
        """Every asset ok, no metric past its alert threshold, the platform alive."""
        return not self.problems


@dataclass(frozen=True)
class _Outcome:
    """What the event log says about one asset key for one tenant."""

    partition_key: str | None = None
    last_success: datetime | None = None
    failed_run_id: str | None = None
    failed_at: datetime | None = None


def watched_assets(definitions: dg.Definitions | None = None) -> dict[str, tuple[dg.AssetKey, ...]]:
    """FRESHNESS names -> the asset keys each stands for (a `@dbt_assets` name: all its models):
    in `definitions`, or else in the code location's committed surface."""
    return watched_assets_of(read_surface()) if definitions is None else watched_in(definitions)


def _outcomes(
    instance: dg.DagsterInstance,
    conn: psycopg.Connection,
    keys: Collection[dg.AssetKey],
    tenant_ids: Collection[str],
) -> dict[tuple[str, dg.AssetKey], _Outcome]:
    """(tenant, key) -> its latest partition's last success, and a failed run since. A tenant's
    latest partition: its only one, or for tenant x month keys its latest month, which the
    twice-daily sync keeps current; a failure of an earlier month (a backfill) does not make
    the tenant's orders unhealthy."""
    found = partition_outcomes(instance, conn, keys, tenant_ids)
    run_ids = sorted({run_id for outcome in found.values() for run_id in outcome.pending_run_ids})
    failed_at = {}
    if run_ids:
        failed_runs = instance.get_run_records(
            dg.RunsFilter(run_ids=run_ids, statuses=[dg.DagsterRunStatus.FAILURE])
        )
        failed_at = {
            r.dagster_run.run_id: (
                datetime.fromtimestamp(r.end_time, UTC) if r.end_time else r.create_timestamp
            )
            for r in failed_runs
        }
    outcomes = {}
    for pair, outcome in found.items():
        failures = sorted((failed_at[r], r) for r in outcome.pending_run_ids if r in failed_at)
        outcomes[pair] = _Outcome(
            partition_key=outcome.partition_key,
            last_success=outcome.last_success,
            failed_run_id=failures[-1][1] if failures else None,
            failed_at=failures[-1][0] if failures else None,
        )
    return outcomes


def _combine(outcomes: Sequence[_Outcome]) -> _Outcome:
    """A group of keys (a dbt asset's models) is as fresh as its stalest model, and failed when
    any of them failed."""
    successes = [o.last_success for o in outcomes if o.last_success is not None]
    failures = sorted((o.failed_at, o.failed_run_id) for o in outcomes if o.failed_run_id)
    return _Outcome(
        partition_key=next((o.partition_key for o in outcomes if o.partition_key), None),
        last_success=min(successes) if successes and len(successes) == len(outcomes) else None,
        failed_run_id=failures[-1][1] if failures else None,
        failed_at=failures[-1][0] if failures else None,
    )


def platform_asset_problems(instance: dg.DagsterInstance, now: datetime) -> list[Problem]:
    """The platform's own assets (PLATFORM_FRESHNESS) not materialized within their window."""
    problems = []
    for name, max_age in PLATFORM_FRESHNESS.items():
        event = instance.get_latest_materialization_event(dg.AssetKey(name))
        if event is None:
            problems.append(Problem("asset", name, "never materialized"))
            continue
        at = datetime.fromtimestamp(event.timestamp, UTC)
        if now - at > max_age:
            problems.append(
                Problem(
                    "asset",
                    name,
                    f"last materialized {format_age(now - at)} ago, at {at:%Y-%m-%d %H:%M} UTC"
                    f" (expected within {format_age(max_age)}): is its schedule running?",
                )
            )
    return problems


def destination_problems(
    conn: psycopg.Connection, tenant_ids: list[str], now: datetime
) -> list[Problem]:
    """A problem per destination audience whose last syncs failed: a push of changes over
    its tenant succeeds meanwhile (it skips the audience while it rests), so the tenant's
    activation asset alone would look healthy."""
    problems = []
    for failing in failing_audiences(conn, tenant_ids):
        until = resting_until(failing.failures_in_a_row, failing.last_failed_at, now)
        rest = (
            f"its changes wait until {until.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
            if until
            else "its next change is pushed"
        )
        problems.append(
            Problem(
                "destination",
                f"{failing.destination_id}/{failing.audience}",
                f"{failing.failures_in_a_row} syncs failed in a row, the last at"
                f" {failing.last_failed_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC; {rest}"
                f" (why: `cdp destinations history {failing.destination_id}`; once fixed:"
                f" `cdp destinations retry {failing.destination_id}`)",
                failing.tenant_id,
            )
        )
    return problems


def collect_status(
    instance: dg.DagsterInstance,
    conn: psycopg.Connection,
    *,
    tenant_ids: Sequence[str] | None = None,
    watched: Mapping[str, Sequence[dg.AssetKey]] | None = None,
    instigators: Sequence[Instigator] | None = None,
    now: datetime | None = None,
) -> Status:
    """The status of every active tenant (or of `tenant_ids`, which must be active) for every
    watched asset (default: every FRESHNESS entry, resolved by `watched_assets()`), the
    operations metrics (with `tenant_ids`, of those tenants' runs and VTEX accounts), and the
    platform's own health (its schedules and sensors: `instigators`, default the code
    location's, from its surface)."""
    now = now or datetime.now(UTC)
    active = [t.tenant_id for t in list_tenants(conn, active_only=True)]
    if tenant_ids:
        unknown = sorted(set(tenant_ids) - set(active))
        if unknown:
            raise TenantError(f"no active tenant {', '.join(map(repr, unknown))}")
        active = [t for t in active if t in tenant_ids]
    watched = watched_assets() if watched is None else watched
    every_key = {key for keys in watched.values() for key in keys}
    outcomes = _outcomes(instance, conn, every_key, active)
    all_keys = [key.to_user_string() for keys in watched.values() for key in keys]
    errors = latest_errors(conn, active, all_keys)
    gaps = order_gaps(conn, active)

    assets = []
    for tenant in active:
        for name, keys in watched.items():
            outcome = _combine([outcomes.get((tenant, key), _Outcome()) for key in keys])
            max_age = FRESHNESS[name]
            tenant_errors = [
                errors[(tenant, k.to_user_string())]
                for k in keys
                if (tenant, k.to_user_string()) in errors
            ]
            assets.append(
                AssetStatus(
                    tenant_id=tenant,
                    asset=name,
                    max_age=max_age,
                    partition_key=outcome.partition_key,
                    last_success=outcome.last_success,
                    stale=outcome.last_success is None or now - outcome.last_success > max_age,
                    failed_run_id=outcome.failed_run_id,
                    failed_at=outcome.failed_at,
                    last_error=max(tenant_errors, key=lambda e: e.occurred_at, default=None),
                    **(_order_gaps(gaps[tenant]) if name == "vtex_orders" else {}),
                )
            )
    if instigators is None:
        instigators = instigators_of(read_surface())
    platform = [
        *daemon_problems(instance, now),
        *instigator_problems(instance, instigators, now),
        *platform_asset_problems(instance, now),
    ]
    return Status(
        checked_at=now,
        platform=tuple(platform),
        open_syncs=tuple(open_activation_runs(conn, active if tenant_ids else None)),
        destinations=tuple(destination_problems(conn, active, now)),
        queued_runs=instance.get_runs_count(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED])),
        in_progress_runs=instance.get_runs_count(dg.RunsFilter(statuses=list(IN_PROGRESS))),
        assets=tuple(assets),
        metrics=collect_metrics(
            instance,
            conn,
            requests_per_second=VtexResource().request_rate(),
            tenant_ids=active if tenant_ids else None,
            now=now,
        ),
    )


@contextmanager
def platform_instance(warehouse_url: str) -> Iterator[dg.DagsterInstance]:
    """The Dagster instance `cdp dev` runs on (DAGSTER_HOME, storage in the warehouse)."""
    prepare_dagster_home(warehouse_url)
    with dg.DagsterInstance.get() as instance:
        yield instance


def _order_gaps(gaps: OrderGaps) -> dict[str, str]:
    return {"degraded": gaps.describe(), "unavailable": gaps.describe_unavailable()}


def _hours(delta: timedelta) -> str:
    return f"{int(delta.total_seconds() // 3600)}h"


def _what(asset: AssetStatus) -> str:
    """What is wrong with an asset that is not ok."""
    if asset.last_success is None:
        what = "never materialized"
    elif asset.stale:
        what = f"last success over {_hours(asset.max_age)} ago"
    else:
        what = ""
    if asset.failed_run_id is not None:
        failed = f"run {asset.failed_run_id} failed at {asset.failed_at:%Y-%m-%d %H:%M}"
        what = f"{what}; {failed}" if what else failed
    if asset.degraded:
        what = f"{what}; degraded: {asset.degraded}" if what else f"degraded: {asset.degraded}"
    return what


def _problem(asset: AssetStatus) -> str:
    lines = [f"  {asset.tenant_id} {asset.asset}: {_what(asset)}"]
    error = asset.last_error
    if error is not None and (asset.last_success is None or error.occurred_at > asset.last_success):
        message = " ".join(error.message.split())  # one line
        if len(message) > ERROR_WIDTH:
            message = message[: ERROR_WIDTH - 1] + "…"
        lines.append(f"    {error.error_type}: {message}")
    return "\n".join(lines)


def render_text(status: Status, *, full: bool | None = None) -> str:
    """The assets' table and what needs attention (or, over SUMMARY_ABOVE_TENANTS tenants unless
    `full`, a summary of them), then the metrics, then the platform."""
    tenant_count = len({a.tenant_id for a in status.assets})
    if full is None:
        full = tenant_count <= SUMMARY_ABOVE_TENANTS
    assets = _render_assets(status) if full else _render_summary(status, tenant_count)
    if status.platform:
        platform = [f"platform: {len(status.platform)} problems"]
        platform.extend(f"  {problem}" for problem in status.platform)
    else:
        platform = ["platform: daemon alive, schedules and sensors ticking, operations fresh"]
    if status.destinations:
        platform.append(f"destinations: {len(status.destinations)} failing")
        platform.extend(f"  {problem}" for problem in status.destinations)
    verdict = "healthy" if status.healthy else f"unhealthy: {len(status.problems)} problems"
    return "\n".join([assets, render_metrics(status.metrics), *platform, verdict])


def _header(status: Status) -> list[str]:
    lines = [
        f"checked {status.checked_at:%Y-%m-%d %H:%M} UTC; runs: {status.queued_runs} queued,"
        f" {status.in_progress_runs} in progress"
    ]
    if status.open_syncs:
        oldest = status.open_syncs[0]
        lines.append(
            f"destination syncs running: {len(status.open_syncs)}, the oldest for"
            f" {format_age(oldest.age)} ({oldest.destination_id}/{oldest.audience},"
            f" run {oldest.dagster_run_id})"
        )
    return lines


def _render_summary(status: Status, tenant_count: int) -> str:
    """Counts by state, per asset where any is not ok, and the tenants with the most assets
    needing attention, each with what is wrong."""
    lines = _header(status)
    states = Counter(a.state for a in status.assets)
    lines.append(
        f"{tenant_count} tenants x {len(status.assets) // max(tenant_count, 1)} assets: "
        + ", ".join(f"{count} {state}" for state, count in states.most_common())
        + " (every tenant's row: --all)"
    )
    problems = [a for a in status.assets if not a.ok]
    if not problems:
        lines.append("all fresh, no failures")
        return "\n".join(lines)
    by_asset: dict[str, Counter[str]] = defaultdict(Counter)
    for a in problems:
        by_asset[a.asset][a.state] += 1
    lines.append(f"{'asset':<26}tenants needing attention")
    for asset, counts in sorted(by_asset.items(), key=lambda item: -item[1].total()):
        described = ", ".join(f"{n} {state}" for state, n in counts.most_common())
        lines.append(f"{asset:<26}{described}")
    by_tenant: dict[str, list[AssetStatus]] = defaultdict(list)
    for a in problems:
        by_tenant[a.tenant_id].append(a)
    worst = sorted(by_tenant.items(), key=lambda item: (-len(item[1]), item[0]))
    shown = worst[:WORST_TENANTS]
    lines.append(
        f"{len(problems)} of {len(status.assets)} need attention, in {len(by_tenant)} tenants;"
        f" the {len(shown)} with the most:"
    )
    lines.extend(_problem(a) for _, assets in shown for a in assets)
    return "\n".join(lines)


def _render_assets(status: Status) -> str:
    """A table (times in UTC), then what needs attention with its latest error."""
    lines = _header(status)
    if not status.assets:
        lines.append("no active tenants")
        return "\n".join(lines)
    width = max(len("tenant"), *(len(a.tenant_id) for a in status.assets)) + 2
    lines.append(
        f"{'tenant':<{width}}{'asset':<26}{'last success':<18}{'age':>7}{'max':>5}  {'state':<14}"
        "last error"
    )
    for a in status.assets:
        when = f"{a.last_success:%Y-%m-%d %H:%M}" if a.last_success else "never"
        age = format_age(status.checked_at - a.last_success) if a.last_success else "-"
        error = a.last_error
        error_text = f"{error.occurred_at:%Y-%m-%d %H:%M} {error.error_type}" if error else ""
        lines.append(
            f"{a.tenant_id:<{width}}{a.asset:<26}{when:<18}{age:>7}{_hours(a.max_age):>5}"
            f"  {a.state:<14}{error_text}".rstrip()
        )
    lines.extend(
        f"  {a.tenant_id} {a.asset}: {a.unavailable}" for a in status.assets if a.unavailable
    )
    problems = [a for a in status.assets if not a.ok]
    if not problems:
        lines.append("all fresh, no failures")
        return "\n".join(lines)
    lines.append(f"{len(problems)} of {len(status.assets)} need attention:")
    lines.extend(_problem(a) for a in problems)
    return "\n".join(lines)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def status_json(status: Status) -> dict[str, Any]:
    """The machine-readable form (`cdp status --json`)."""
    return {
        "checked_at": _iso(status.checked_at),
        "healthy": status.healthy,
        "problems": [problem.as_json() for problem in status.problems],
        "runs": {"queued": status.queued_runs, "in_progress": status.in_progress_runs},
        "destination_syncs_running": [
            {
                "tenant_id": sync.tenant_id,
                "destination_id": sync.destination_id,
                "audience": sync.audience,
                "dagster_run_id": sync.dagster_run_id,
                "started_at": _iso(sync.started_at),
                "age_seconds": int(sync.age.total_seconds()),
            }
            for sync in status.open_syncs
        ],
        "assets": [
            {
                "tenant_id": a.tenant_id,
                "asset": a.asset,
                "state": a.state,
                "ok": a.ok,
                "partition_key": a.partition_key,
                "last_success": _iso(a.last_success),
                "age_seconds": (
                    int((status.checked_at - a.last_success).total_seconds())
                    if a.last_success
                    else None
                ),
                "max_age_seconds": int(a.max_age.total_seconds()),
                "stale": a.stale,
                "degraded": a.degraded or None,
                "unavailable": a.unavailable or None,
                "failed_run_id": a.failed_run_id,
                "failed_at": _iso(a.failed_at),
                "last_error": a.last_error
                and {
                    "occurred_at": _iso(a.last_error.occurred_at),
                    "error_type": a.last_error.error_type,
                    "message": a.last_error.message,
                    "run_id": a.last_error.run_id,
                    "job_name": a.last_error.job_name,
                    "step_key": a.last_error.step_key,
                    "partition_key": a.last_error.partition_key,
                },
            }
            for a in status.assets
        ],
        "metrics": metrics_json(status.metrics),
    }
