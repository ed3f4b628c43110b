"""Operations metrics: the KPIs of the dashboard the platform replaces, computed from what
Dagster (run storage, event log) and Postgres already record, each judged against a target
(missed: warn) and an alert threshold (crossed: error).

| metric | figure | target | alert |
|---|---|---|---|
| `sync_success_pct` | per tenant, succeeded / finished ingestion runs, last 24 h | > 95 | < 90 |
| `avg_sync_seconds` | per tenant, mean time of its ingestion runs, last 24 h | < 7200 | > 14400 |
| `step_error_pct` | per tenant, failed / finished steps of its runs, last 24 h | < 5 | > 10 |
| `api_budget_pct` | per VTEX account, requests ÷ (requests/s × seconds), last hour | < 80 | > 90 |
| `db_connections` | client connections to the platform's database | < 50 | > 80 |

Each tenant (or account) is judged on its own figures, so one tenant's failures alert as that
tenant's and leave the others' figures alone; runs over several tenants at once are judged
together as subject ''. Only active tenants count: a deactivated tenant's runs leave the
figures at once. Each metric also has one aggregate over everyone (`MetricsReport.aggregates`),
which the asset plots, naming the worst tenants beside it.

The figures are pure functions of run, step and API samples (`evaluate`), so tests feed them
synthetic histories; `collect_history` reads the samples from an instance, and
`collect_metrics` does both. The `operations_metrics` asset (ops/assets.py) and `cdp status`
both report `collect_metrics`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import dagster as dg
import psycopg

from cdp_assets.lib import settings
from cdp_assets.ops.sync_errors import tenant_from_tags
from cdp_assets.partitions import tenant_of_partition_key
from cdp_assets.tenants.registry import list_tenants

# The VTEX ingestion assets (group "vtex"): a run that plans any of them is a sync, and their
# materializations carry the sync's VTEX request counts (`Landing.metadata()`).
INGESTION_ASSETS = (
    "vtex_orders",
    "vtex_products",
    "vtex_skus",
    "vtex_customers",
    "vtex_orders_feed",
)
# Ingestion assets whose run over several partitions records each partition's own figures,
# requests included (a feed drain's, per tenant); the others record the run's requests on each.
OWN_FIGURES_PER_PARTITION = ("vtex_orders_feed",)
WINDOW = timedelta(hours=24)
# VTEX limits requests per second: over a whole day even a saturated hour averages out, so
# the budget is judged over the last hour.
API_WINDOW = timedelta(hours=1)
THRESHOLDS_ENV = "CDP_OPS_THRESHOLDS"


class Severity(StrEnum):
    OK = "ok"
    WARN = "warn"  # the target is missed
    ERROR = "error"  # the alert threshold is crossed


_RANK = {Severity.OK: 0, Severity.WARN: 1, Severity.ERROR: 2}


@dataclass(frozen=True)
class Threshold:
    target: float
    alert: float
    higher_is_better: bool = False

    def judge(self, value: float) -> Severity:
        if self.higher_is_better:
            if value < self.alert:
                return Severity.ERROR
            return Severity.OK if value > self.target else Severity.WARN
        if value > self.alert:
            return Severity.ERROR
        return Severity.OK if value < self.target else Severity.WARN

    def describe(self) -> str:
        good, bad = (">", "<") if self.higher_is_better else ("<", ">")
        return f"target {good} {self.target:g}, alert {bad} {self.alert:g}"


# The old dashboard's thresholds, the defaults; $CDP_OPS_THRESHOLDS and the asset's
# `ops_metrics` resource override them (`load_thresholds`).
DEFAULT_THRESHOLDS: dict[str, Threshold] = {
    "sync_success_pct": Threshold(target=95, alert=90, higher_is_better=True),
    "avg_sync_seconds": Threshold(target=2 * 3600, alert=4 * 3600),
    "step_error_pct": Threshold(target=5, alert=10),
    "api_budget_pct": Threshold(target=80, alert=90),
    "db_connections": Threshold(target=50, alert=80),
}
LABELS = {
    "sync_success_pct": "sync success rate, % of ingestion runs (24 h)",
    "avg_sync_seconds": "average sync time, seconds",
    "step_error_pct": "error rate, % of steps failed (24 h)",
    "api_budget_pct": "VTEX request budget used, % (last hour)",
    "db_connections": "database connections in use",
}
# Metrics judged per subject (each figure alerts on its own); the others are platform-wide.
SUBJECTS = {
    "sync_success_pct": "tenant",
    "avg_sync_seconds": "tenant",
    "step_error_pct": "tenant",
    "api_budget_pct": "account",
}


def load_thresholds(
    overrides: Mapping[str, Mapping[str, float]] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Threshold]:
    """DEFAULT_THRESHOLDS, then $CDP_OPS_THRESHOLDS (JSON such as
    `{"avg_sync_seconds": {"target": 60, "alert": 300}}`), then `overrides` (same shape)."""
    layers: list[tuple[str, Mapping[str, Any]]] = []
    configured = settings.value(THRESHOLDS_ENV, environ)
    if configured:
        try:
            layers.append((f"${THRESHOLDS_ENV}", json.loads(configured)))
        except json.JSONDecodeError as error:
            raise ValueError(f"${THRESHOLDS_ENV} is not JSON: {error}") from None
    if overrides:
        layers.append(("the ops_metrics resource", overrides))
    found = dict(DEFAULT_THRESHOLDS)
    for origin, layer in layers:
        if not isinstance(layer, Mapping):
            raise ValueError(f"{origin}: expected an object of metrics")
        for name, fields in layer.items():
            if name not in found:
                raise ValueError(f"{origin}: unknown metric {name!r} (known: {', '.join(found)})")
            if not isinstance(fields, Mapping) or not set(fields) <= {"target", "alert"}:
                raise ValueError(f"{origin}: {name} takes only 'target' and 'alert'")
            current = found[name]
            found[name] = replace(
                current,
                target=float(fields["target"]) if "target" in fields else current.target,
                alert=float(fields["alert"]) if "alert" in fields else current.alert,
            )
    for name, threshold in found.items():
        inside = (
            threshold.alert > threshold.target
            if threshold.higher_is_better
            else threshold.alert < threshold.target
        )
        if inside:
            raise ValueError(f"{name}: alert {threshold.alert:g} is better than target")
    return found


@dataclass(frozen=True)
class RunSample:
    """A run that planned an ingestion asset."""

    run_id: str
    tenant_id: str | None  # None when the run was not for exactly one tenant
    status: dg.DagsterRunStatus
    started_at: datetime | None
    ended_at: datetime | None


@dataclass(frozen=True)
class StepSample:
    """A step that finished (succeeded or failed for good: retried attempts are not steps)."""

    run_id: str
    tenant_id: str | None  # its run's
    step_key: str
    failed: bool
    ended_at: datetime


@dataclass(frozen=True)
class ApiSample:
    """An ingestion materialization's VTEX requests, from its `api_*` and `seconds` metadata
    (one per run and asset: a run over several partitions records the same figures on each;
    one per run and partition for OWN_FIGURES_PER_PARTITION)."""

    run_id: str
    asset: str
    tenant_ids: tuple[str, ...]
    requests: int
    throttled: int  # 429 responses
    seconds: float
    ended_at: datetime
    # The pace the run's client kept (its `api_requests_per_second`): the budget it used is
    # judged against it, whatever the process reading the metrics would configure.
    requests_per_second: float | None = None


@dataclass(frozen=True)
class History:
    runs: tuple[RunSample, ...]
    steps: tuple[StepSample, ...]
    api: tuple[ApiSample, ...]


@dataclass(frozen=True)
class Connections:
    database: int  # client connections to the platform's database: the judged figure
    server: int
    max_connections: int


@dataclass(frozen=True)
class ApiUsage:
    requests: float
    throttled: float
    budget_pct: float


_FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE)


def _finished_since(run: RunSample, since: datetime) -> bool:
    return run.status in _FINISHED and run.ended_at is not None and run.ended_at >= since


def _subject(tenant_id: str | None) -> str:
    return tenant_id or ""


def sync_success_pct(runs: Sequence[RunSample], since: datetime) -> dict[str, float]:
    """Per tenant ('' for runs over several), succeeded / finished ingestion runs that ended
    since `since`, in %; a subject without any has no figure. A canceled run was stopped by
    someone, not failed by the sync, and is left out."""
    finished: dict[str, list[bool]] = defaultdict(list)
    for run in runs:
        if _finished_since(run, since):
            finished[_subject(run.tenant_id)].append(run.status == dg.DagsterRunStatus.SUCCESS)
    return {subject: _pct(ok) for subject, ok in sorted(finished.items())}


def _pct(flags: Sequence[bool]) -> float:
    return 100.0 * sum(flags) / len(flags)


def _durations(runs: Sequence[RunSample], since: datetime, now: datetime) -> dict[str, list[float]]:
    """Seconds each ingestion run took from start to end, by subject, over runs that ended
    since `since` (failed ones too: their time was spent syncing) and runs still going,
    counted with their time so far, so a stuck sync shows before it ends."""
    durations: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        if run.started_at is None:
            continue
        if _finished_since(run, since):
            end = run.ended_at
        elif run.status == dg.DagsterRunStatus.STARTED:
            end = now
        else:
            continue
        assert end is not None  # a finished run has ended
        durations[_subject(run.tenant_id)].append((end - run.started_at).total_seconds())
    return durations


def avg_sync_seconds(runs: Sequence[RunSample], since: datetime, now: datetime) -> dict[str, float]:
    """Per tenant, the mean time of its ingestion runs (`_durations`)."""
    return {
        tenant: sum(d) / len(d)
        for tenant, d in sorted(_durations(runs, since, now).items())
        if tenant
    }


def step_error_pct(steps: Sequence[StepSample], since: datetime) -> dict[str, float]:
    """Per tenant ('' for runs over several), failed / finished steps since `since`, in %."""
    finished: dict[str, list[bool]] = defaultdict(list)
    for step in steps:
        if step.ended_at >= since:
            finished[_subject(step.tenant_id)].append(step.failed)
    return {subject: _pct(failed) for subject, failed in sorted(finished.items())}


def api_usage(
    samples: Sequence[ApiSample],
    account_of: Mapping[str, str],
    requests_per_second: float,
    since: datetime,
    now: datetime,
) -> dict[str, ApiUsage]:
    """Per VTEX account, requests in [since, now] ÷ (requests per second × the window's
    seconds), in %, and the 429s among them. Each sample's requests are weighed against the
    pace its run kept, `requests_per_second` for samples that did not record one. A
    materialization's requests are spread evenly over the `seconds` before it was recorded, so
    a sync straddling the window's start counts its share only; a run over tenants of several
    accounts is split evenly between them."""
    window = (now - since).total_seconds()
    requests: dict[str, float] = defaultdict(float)
    throttled: dict[str, float] = defaultdict(float)
    budget_seconds: dict[str, float] = defaultdict(float)  # requests ÷ their pace
    for sample in samples:
        if not since <= sample.ended_at <= now:
            continue
        if sample.seconds > 0:
            began = sample.ended_at - timedelta(seconds=sample.seconds)
            share = (sample.ended_at - max(began, since)).total_seconds() / sample.seconds
        else:
            share = 1.0
        accounts = sorted({account_of[t] for t in sample.tenant_ids if t in account_of})
        pace = sample.requests_per_second or requests_per_second
        for account in accounts:
            requests[account] += sample.requests * share / len(accounts)
            throttled[account] += sample.throttled * share / len(accounts)
            budget_seconds[account] += sample.requests * share / len(accounts) / pace
    return {
        account: ApiUsage(
            requests=requests[account],
            throttled=throttled[account],
            budget_pct=100.0 * budget_seconds[account] / window,
        )
        for account in sorted(requests)
    }


@dataclass(frozen=True)
class Figure:
    metric: str
    subject: str  # the tenant or account; '' for platform-wide metrics
    value: float
    severity: Severity

    @property
    def key(self) -> str:
        """Its metadata key: one plot per metric, and per tenant or account."""
        return f"{self.metric}/{self.subject}" if self.subject else self.metric


# A metric's worst subjects named beside its aggregate.
WORST_LISTED = 3


@dataclass(frozen=True)
class MetricsReport:
    checked_at: datetime
    thresholds: Mapping[str, Threshold]
    # One per metric and subject with data: no runs in the window judge nothing.
    figures: tuple[Figure, ...]
    # One per metric with data, over every subject: what the asset plots.
    aggregates: Mapping[str, float]
    # What the figures are made of (run and step counts, requests and 429s per account).
    counts: Mapping[str, float]

    def of(self, metric: str) -> list[Figure]:
        return [f for f in self.figures if f.metric == metric]

    def ranked(self, metric: str) -> list[Figure]:
        """The metric's figures, worst first: by severity, then by value."""
        sign = 1 if self.thresholds[metric].higher_is_better else -1
        return sorted(self.of(metric), key=lambda f: (-_RANK[f.severity], sign * f.value))

    def worst(self, metric: str) -> Figure | None:
        return next(iter(self.ranked(metric)), None)

    @property
    def alerting(self) -> list[Figure]:
        return [f for f in self.figures if f.severity == Severity.ERROR]


def evaluate(
    history: History,
    connections: Connections,
    thresholds: Mapping[str, Threshold],
    account_of: Mapping[str, str],
    requests_per_second: float,
    now: datetime,
    tenant_ids: Collection[str] | None = None,
) -> MetricsReport:
    """The figures and their severities. `account_of` maps the active tenants to their VTEX
    accounts: runs and steps of any other tenant (a deactivated one) are left out. With
    `tenant_ids`, runs and steps of those tenants only, and the accounts they use (an
    account's budget is shared by all its tenants)."""
    since = now - WINDOW

    def counted(tenant_id: str | None) -> bool:
        if tenant_ids is not None:
            return tenant_id in tenant_ids
        return tenant_id is None or tenant_id in account_of

    runs = tuple(r for r in history.runs if counted(r.tenant_id))
    steps = tuple(s for s in history.steps if counted(s.tenant_id))
    accounts = set(account_of.values())
    if tenant_ids is not None:
        accounts = {account_of[t] for t in tenant_ids if t in account_of}

    values: list[tuple[str, str, float]] = []
    values.extend(("sync_success_pct", t, v) for t, v in sync_success_pct(runs, since).items())
    values.extend(("avg_sync_seconds", t, v) for t, v in avg_sync_seconds(runs, since, now).items())
    values.extend(("step_error_pct", t, v) for t, v in step_error_pct(steps, since).items())
    usage = api_usage(history.api, account_of, requests_per_second, now - API_WINDOW, now)
    usage = {a: u for a, u in usage.items() if a in accounts}
    values.extend(("api_budget_pct", a, u.budget_pct) for a, u in usage.items())
    values.append(("db_connections", "", float(connections.database)))

    finished = [r for r in runs if _finished_since(r, since)]
    steps_done = [s for s in steps if s.ended_at >= since]
    durations = [d for ds in _durations(runs, since, now).values() for d in ds]
    aggregates: dict[str, float] = {"db_connections": float(connections.database)}
    if finished:
        aggregates["sync_success_pct"] = _pct(
            [r.status == dg.DagsterRunStatus.SUCCESS for r in finished]
        )
    if durations:
        aggregates["avg_sync_seconds"] = sum(durations) / len(durations)
    if steps_done:
        aggregates["step_error_pct"] = _pct([s.failed for s in steps_done])
    if usage:  # accounts have budgets of their own: the nearest to its limit
        aggregates["api_budget_pct"] = max(u.budget_pct for u in usage.values())
    counts: dict[str, float] = {
        "ingestion_runs": len(finished),
        "ingestion_runs_failed": sum(r.status == dg.DagsterRunStatus.FAILURE for r in finished),
        "steps": len(steps_done),
        "steps_failed": sum(s.failed for s in steps_done),
        "api_requests": round(sum(u.requests for u in usage.values()), 1),
        "api_429_responses": round(sum(u.throttled for u in usage.values()), 1),
        "db_connections_server": connections.server,
        "db_max_connections": connections.max_connections,
    }
    for account, used in usage.items():
        counts[f"api_requests/{account}"] = round(used.requests, 1)
        counts[f"api_429_responses/{account}"] = round(used.throttled, 1)
    return MetricsReport(
        checked_at=now,
        thresholds=thresholds,
        figures=tuple(
            Figure(metric, subject, value, thresholds[metric].judge(value))
            for metric, subject, value in values
        ),
        aggregates={m: aggregates[m] for m in thresholds if m in aggregates},
        counts=counts,
    )


# Event ids follow the order events were written; writers' clocks may differ a little, so a
# newest-first scan reads this far past its start before it stops.
_CLOCK_SLACK = 60.0
_PAGE = 500


def _newest_first(
    fetch: Callable[[int | None], Sequence[dg.EventLogRecord]], since: float
) -> Iterator[dg.EventLogRecord]:
    """Records at or after `since`, paging back from the newest: the event log's indexes are
    by type (or asset) and id, not time, so a time filter alone would read its whole history."""
    before = None
    while True:
        page = fetch(before)
        yield from (r for r in page if r.timestamp >= since)
        if len(page) < _PAGE or page[-1].timestamp < since - _CLOCK_SLACK:
            return
        before = page[-1].storage_id


def _events(
    instance: dg.DagsterInstance,
    event_type: dg.DagsterEventType,
    since: float,
    asset_key: dg.AssetKey | None = None,
) -> Iterator[dg.EventLogRecord]:
    storage = instance.event_log_storage
    return _newest_first(
        lambda before: storage.get_event_records(
            dg.EventRecordsFilter(event_type, asset_key=asset_key, before_cursor=before),
            limit=_PAGE,
            ascending=False,
        ),
        since,
    )


def _materializations(
    instance: dg.DagsterInstance, key: dg.AssetKey, since: float
) -> Iterator[dg.EventLogRecord]:
    return _newest_first(
        lambda before: (
            instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, before_storage_id=before), limit=_PAGE
            ).records
        ),
        since,
    )


def _moment(timestamp: float | None) -> datetime | None:
    return datetime.fromtimestamp(timestamp, UTC) if timestamp is not None else None


def _number(metadata: Mapping[str, dg.MetadataValue], key: str) -> float:
    value = metadata.get(key)
    if value is None:
        return 0.0
    number = value.value
    if not isinstance(number, int | float | str):
        raise TypeError(f"metadata {key!r} holds {type(number).__name__}, not a number")
    return float(number)


def collect_history(instance: dg.DagsterInstance, now: datetime) -> History:
    """Ingestion runs and steps that ended in the last WINDOW (or are still going), and the
    ingestion materializations of the last API_WINDOW, from the instance."""
    since = now - WINDOW
    records = {
        r.dagster_run.run_id: r
        for r in instance.get_run_records(dg.RunsFilter(updated_after=since))
    }
    # A run still going since before the window was last updated when it started.
    for record in instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
        records.setdefault(record.dagster_run.run_id, record)

    # Ingestion runs are those that planned an ingestion asset, which is recorded when the
    # run is created: scheduled runs of an asset job carry no asset selection to tell by.
    ingestion: set[str] = set()
    if records:
        created = min(r.create_timestamp for r in records.values()).timestamp()
        for name in INGESTION_ASSETS:
            planned = _events(
                instance,
                dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
                created - _CLOCK_SLACK,
                dg.AssetKey(name),
            )
            ingestion.update(r.run_id for r in planned if r.run_id in records)
    runs = tuple(
        RunSample(
            run_id=run_id,
            tenant_id=tenant_from_tags(records[run_id].dagster_run.tags),
            status=records[run_id].dagster_run.status,
            started_at=_moment(records[run_id].start_time),
            ended_at=_moment(records[run_id].end_time),
        )
        for run_id in sorted(ingestion)
    )

    steps = []
    for event_type in (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE):
        for event in _events(instance, event_type, since.timestamp()):
            run = records.get(event.run_id)
            steps.append(
                StepSample(
                    run_id=event.run_id,
                    tenant_id=tenant_from_tags(run.dagster_run.tags) if run else None,
                    step_key=event.event_log_entry.step_key or "",
                    failed=event_type == dg.DagsterEventType.STEP_FAILURE,
                    ended_at=datetime.fromtimestamp(event.timestamp, UTC),
                )
            )

    api = []
    for name in INGESTION_ASSETS:
        by_run: dict[int | tuple[str, str | None], list[dg.EventLogRecord]] = defaultdict(list)
        own = name in OWN_FIGURES_PER_PARTITION
        for event in _materializations(instance, dg.AssetKey(name), (now - API_WINDOW).timestamp()):
            # Runless reports (no run id) each stand alone.
            if not event.run_id:
                by_run[event.storage_id].append(event)
            else:
                by_run[(event.run_id, event.partition_key if own else None)].append(event)
        for events in by_run.values():
            latest = max(events, key=lambda e: e.storage_id)
            assert latest.asset_materialization is not None  # the records are materializations
            metadata = latest.asset_materialization.metadata
            if "api_requests" not in metadata:
                continue
            tenants = {tenant_of_partition_key(e.partition_key or "") for e in events}
            api.append(
                ApiSample(
                    run_id=latest.run_id,
                    asset=name,
                    tenant_ids=tuple(sorted(t for t in tenants if t)),
                    requests=int(_number(metadata, "api_requests")),
                    throttled=int(_number(metadata, "api_429_responses")),
                    seconds=_number(metadata, "seconds"),
                    ended_at=datetime.fromtimestamp(latest.timestamp, UTC),
                    requests_per_second=_number(metadata, "api_requests_per_second") or None,
                )
            )
    return History(runs=runs, steps=tuple(steps), api=tuple(api))


def count_connections(conn: psycopg.Connection) -> Connections:
    """Client connections (idle ones hold a slot too) to this database and to the server."""
    # Within a transaction pg_stat_activity answers from a snapshot taken at its first read.
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE datname = current_database()), count(*),"
        " current_setting('max_connections')::int"
        " FROM pg_stat_activity WHERE backend_type = 'client backend'"
    ).fetchone()
    assert row is not None
    database, server, limit = row
    return Connections(database=database, server=server, max_connections=limit)


def collect_metrics(
    instance: dg.DagsterInstance,
    conn: psycopg.Connection,
    *,
    thresholds: Mapping[str, Threshold] | None = None,
    requests_per_second: float,
    tenant_ids: Collection[str] | None = None,
    now: datetime | None = None,
) -> MetricsReport:
    """The metrics now (thresholds: `load_thresholds()` unless given)."""
    now = now or datetime.now(UTC)
    account_of = {t.tenant_id: t.account_name for t in list_tenants(conn, active_only=True)}
    return evaluate(
        collect_history(instance, now),
        count_connections(conn),
        load_thresholds() if thresholds is None else thresholds,
        account_of,
        requests_per_second,
        now,
        tenant_ids,
    )


def _listed(figures: Sequence[Figure], limit: int = WORST_LISTED) -> str:
    named = ", ".join(
        f"{f.subject or 'several tenants'} {f.value:.1f} ({f.severity})" for f in figures[:limit]
    )
    more = len(figures) - limit
    return named + (f" and {more} more" if more > 0 else "")


def worst_named(report: MetricsReport, metric: str) -> str:
    """The subjects missing the metric's target, worst first (at most WORST_LISTED)."""
    missing = [f for f in report.ranked(metric) if f.severity != Severity.OK]
    return _listed(missing) if missing else "none"


def check_description(report: MetricsReport, metric: str) -> str:
    threshold = report.thresholds[metric].describe()
    figures = report.ranked(metric)
    if not figures:
        return f"{LABELS[metric]}: no data ({threshold})"
    worst = figures[0]
    if worst.subject or metric in SUBJECTS:
        missing = [f for f in figures if f.severity != Severity.OK]
        subjects = f"{len(figures)} {SUBJECTS.get(metric, 'subject')}s"
        if not missing:
            return f"{LABELS[metric]}: all {subjects} on target; {threshold}"
        return (
            f"{LABELS[metric]}: {len(missing)} of {subjects} off target, worst"
            f" {_listed(missing)}; {threshold}"
        )
    return f"{LABELS[metric]}: {worst.value:.1f}, {worst.severity}; {threshold}"


def render_metrics(report: MetricsReport) -> str:
    """Lines for `cdp status`: each metric's aggregate against its thresholds, the subjects
    off target, and what is alerting."""
    counts = report.counts
    lines = [
        f"metrics: {counts['ingestion_runs']:g} ingestion runs ({counts['ingestion_runs_failed']:g}"
        f" failed) and {counts['steps']:g} steps ({counts['steps_failed']:g} failed) in 24 h"
    ]
    for metric, threshold in report.thresholds.items():
        worst = report.worst(metric)
        if metric not in report.aggregates or worst is None:
            lines.append(f"  {metric:<24}{'-':>10}  {'no data':<9}{threshold.describe()}")
            continue
        extra = f"; {counts['api_429_responses']:g} HTTP 429" if metric == "api_budget_pct" else ""
        lines.append(
            f"  {metric:<24}{report.aggregates[metric]:>10.1f}  {worst.severity:<9}"
            f"{threshold.describe()}{extra}"
        )
        missing = [f for f in report.ranked(metric) if f.severity != Severity.OK and f.subject]
        for figure in missing:
            extra = ""
            if metric == "api_budget_pct":
                extra = f"; {counts[f'api_429_responses/{figure.subject}']:g} HTTP 429"
            lines.append(f"    {figure.subject:<22}{figure.value:>10.1f}  {figure.severity}{extra}")
    alerting = report.alerting
    if alerting:
        listed = ", ".join(f.key for f in alerting)
        lines.append(f"{len(alerting)} past the alert threshold: {listed}")
    return "\n".join(lines)


def metrics_json(report: MetricsReport) -> dict[str, Any]:
    return {
        "checked_at": report.checked_at.isoformat(),
        "alerting": bool(report.alerting),
        "thresholds": {
            name: {"target": t.target, "alert": t.alert, "higher_is_better": t.higher_is_better}
            for name, t in report.thresholds.items()
        },
        "aggregates": dict(report.aggregates),
        "figures": [
            {
                "metric": f.metric,
                "subject": f.subject or None,
                "value": f.value,
                "severity": str(f.severity),
            }
            for f in report.figures
        ],
        "counts": dict(report.counts),
    }
