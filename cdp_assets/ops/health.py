"""Is the platform alive: the database answers, the daemon's heartbeats are fresh and every
schedule and sensor that is on keeps ticking. With the tenants' assets and the operations
metrics (`status.py`) these make the one verdict of `cdp status --check` and of the HTTP
health endpoint (`health_server.py`).

Each problem names what is wrong and, where it is one tenant's, the tenant: an operator reads
the verdict, not a stack trace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import dagster as dg
import psycopg
from dagster._core.scheduler.instigation import (
    InstigatorState,
    InstigatorStatus,
    InstigatorType,
    TickStatus,
)
from dagster._utils.schedules import cron_string_iterator

from cdp_assets.lib import settings
from cdp_assets.lib.ages import format_age
from cdp_assets.lib.redaction import redact
from cdp_assets.ops.surface import Surface

# The daemon writes a heartbeat every 30 s per daemon thread; Dagster's own tolerance (30
# minutes) is for its UI, far too late for a probe. $CDP_HEARTBEAT_TOLERANCE_SECONDS sets it,
# above the heartbeats' interval.
HEARTBEAT_TOLERANCE_ENV = "CDP_HEARTBEAT_TOLERANCE_SECONDS"
HEARTBEAT_INTERVAL = timedelta(seconds=30)
# A sensor is stalled once it missed several of its intervals (a busy daemon runs late), a
# schedule once its next tick is this late.
SENSOR_MISSED_INTERVALS = 3
SENSOR_GRACE = timedelta(minutes=5)
SCHEDULE_GRACE = timedelta(minutes=10)
DATABASE_TIMEOUT_SECONDS = 5
DETAIL_WIDTH = 300


@dataclass(frozen=True)
class Problem:
    """One reason the platform is not healthy."""

    check: str  # database, daemon, schedule, sensor, metric, asset
    subject: str  # what failed it: a daemon, a schedule, a metric, an asset
    detail: str
    tenant_id: str | None = None

    def as_json(self) -> dict[str, str | None]:
        return {
            "check": self.check,
            "subject": self.subject,
            "tenant_id": self.tenant_id,
            "detail": self.detail,
        }

    def __str__(self) -> str:
        tenant = f"tenant {self.tenant_id} " if self.tenant_id else ""
        return f"{self.check}: {tenant}{self.subject}: {self.detail}"


def one_line(text: str, width: int = DETAIL_WIDTH) -> str:
    """An error message as a redacted line of at most `width` characters."""
    line = " ".join(redact(text).split())
    return line if len(line) <= width else line[: width - 1] + "…"


def database_problem(url: str) -> Problem | None:
    """None when the warehouse answers a query within DATABASE_TIMEOUT_SECONDS."""
    try:
        with psycopg.connect(url, connect_timeout=DATABASE_TIMEOUT_SECONDS) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as error:
        return Problem("database", "warehouse", one_line(f"{type(error).__name__}: {error}"))
    return None


def heartbeat_tolerance(environ: Mapping[str, str] | None = None) -> timedelta:
    """How old the daemon's last heartbeat may be (its setting), more than the heartbeats'
    interval."""
    raw = settings.required(HEARTBEAT_TOLERANCE_ENV, environ)
    try:
        tolerance = timedelta(seconds=float(raw))
    except ValueError:
        raise ValueError(f"${HEARTBEAT_TOLERANCE_ENV} is not a number of seconds") from None
    if tolerance <= HEARTBEAT_INTERVAL:
        raise ValueError(
            f"${HEARTBEAT_TOLERANCE_ENV} must exceed the daemon's heartbeat interval"
            f" ({HEARTBEAT_INTERVAL.seconds} s)"
        )
    return tolerance


def daemon_problems(instance: dg.DagsterInstance, now: datetime) -> list[Problem]:
    """The daemons the instance needs whose heartbeat is missing or old (one problem for all
    of them: a stopped dagster-daemon stops them together), and each that reports an error
    (Dagster keeps a daemon's errors in its heartbeats for 5 minutes)."""
    tolerance = heartbeat_tolerance()
    heartbeats = instance.get_daemon_heartbeats()
    silent, last_beats, problems = [], [], []
    for daemon in sorted(instance.get_required_daemon_types()):
        heartbeat = heartbeats.get(daemon)
        beat = datetime.fromtimestamp(heartbeat.timestamp, UTC) if heartbeat else None
        if beat is None or now - beat > tolerance:
            silent.append(daemon)
            if beat is not None:
                last_beats.append(beat)
        elif heartbeat is not None and heartbeat.errors:
            error = heartbeat.errors[0]
            detail = f"reported {error.cls_name}: {error.message}"
            problems.append(Problem("daemon", daemon, one_line(detail)))
    if silent:
        last = max(last_beats, default=None)
        since = f"last heartbeat {format_age(now - last)} ago" if last else "no heartbeat ever"
        detail = f"{since} (tolerated: {format_age(tolerance)}): is dagster-daemon running?"
        problems.insert(0, Problem("daemon", ", ".join(silent), detail))
    return problems


@dataclass(frozen=True)
class Instigator:
    """A schedule or sensor of the code location, as defined."""

    name: str
    kind: InstigatorType
    default_running: bool
    cron_schedule: str | None = None
    timezone: str | None = None
    interval: timedelta | None = None


def instigators_of(surface: Surface) -> list[Instigator]:
    """The schedules and sensors of the code location whose surface (`surface.py`) is given."""
    found = [
        Instigator(
            name,
            InstigatorType.SCHEDULE,
            schedule["default_running"],
            cron_schedule=schedule["cron_schedule"],
            timezone=schedule["timezone"],
        )
        for name, schedule in surface["schedules"].items()
    ]
    found.extend(
        Instigator(
            name,
            InstigatorType.SENSOR,
            sensor["default_running"],
            interval=timedelta(seconds=sensor["minimum_interval_seconds"]),
        )
        for name, sensor in surface["sensors"].items()
    )
    return found


def _is_on(state: InstigatorState | None, instigator: Instigator) -> bool:
    if state is None or state.status == InstigatorStatus.DECLARED_IN_CODE:
        return instigator.default_running
    return state.status == InstigatorStatus.RUNNING


def _next_due(instigator: Instigator, after: datetime) -> datetime:
    """When the instigator should tick next after a tick at `after`."""
    if instigator.interval is not None:
        return after + SENSOR_MISSED_INTERVALS * instigator.interval + SENSOR_GRACE
    assert instigator.cron_schedule is not None  # a schedule, not a sensor
    ticks = cron_string_iterator(
        after.timestamp() + 1, instigator.cron_schedule, instigator.timezone
    )
    return next(ticks).astimezone(UTC) + SCHEDULE_GRACE


def instigator_problems(
    instance: dg.DagsterInstance, instigators: Iterable[Instigator], now: datetime
) -> list[Problem]:
    """Each schedule or sensor that is on and whose last tick failed or is overdue.

    What has never ticked is judged from when it was turned on; a schedule or sensor on by
    default that the daemon never evaluated is the daemon's problem (`daemon_problems`)."""
    wanted = {(i.name, i.kind): i for i in instigators}
    states = {
        (s.instigator_name, s.instigator_type): s
        for s in instance.all_instigator_state()
        if (s.instigator_name, s.instigator_type) in wanted
    }
    problems = []
    for key, instigator in sorted(wanted.items()):
        state = states.get(key)
        if state is None or not _is_on(state, instigator):
            continue
        kind = "schedule" if instigator.kind == InstigatorType.SCHEDULE else "sensor"
        ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=1)
        if ticks:
            tick = ticks[0]
            last = datetime.fromtimestamp(tick.timestamp, UTC)
            if tick.status == TickStatus.FAILURE and tick.error is not None:
                detail = f"last tick failed at {last:%Y-%m-%d %H:%M} UTC: {tick.error.message}"
                problems.append(Problem(kind, instigator.name, one_line(detail)))
                continue
        else:
            started = _started_at(state)
            if started is None:
                continue
            last = started
        due = _next_due(instigator, last)
        if now > due:
            problems.append(
                Problem(
                    kind,
                    instigator.name,
                    f"no tick since {last:%Y-%m-%d %H:%M} UTC; one was due by {due:%Y-%m-%d %H:%M}"
                    " UTC",
                )
            )
    return problems


def _started_at(state: InstigatorState) -> datetime | None:
    data = state.instigator_data
    started = getattr(data, "start_timestamp", None) or getattr(
        data, "last_sensor_start_timestamp", None
    )
    return datetime.fromtimestamp(started, UTC) if started else None
