"""Alerts on operations metrics: one post when a figure crosses its alert threshold and one when
it comes back, none at the evaluations in between.

The last severity of each metric and subject is kept in `cdp.ops_metric_states`. A crossing
whose post did not reach the webhook leaves its stored state as it was, so the next
evaluation posts it again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import psycopg

from cdp_assets.ops.metrics import SUBJECTS, Figure, MetricsReport, Severity, Threshold
from cdp_assets.ops.webhook import post_alert


@dataclass(frozen=True)
class Crossing:
    figure: Figure
    previous: Severity
    threshold: Threshold

    @property
    def recovered(self) -> bool:
        return self.figure.severity != Severity.ERROR


def crossings(
    previous: Mapping[tuple[str, str], Severity], report: MetricsReport
) -> list[Crossing]:
    """Figures that entered the alert state, or left it, since `previous` ((metric, subject) ->
    severity; a figure seen for the first time was ok)."""
    found = []
    for figure in report.figures:
        before = previous.get((figure.metric, figure.subject), Severity.OK)
        if (before == Severity.ERROR) != (figure.severity == Severity.ERROR):
            found.append(Crossing(figure, before, report.thresholds[figure.metric]))
    return found


def crossing_payload(crossing: Crossing) -> dict[str, str]:
    """`{"text": ...}`, like the failed-run alerts."""
    figure = crossing.figure
    where = f" for {SUBJECTS[figure.metric]} {figure.subject}" if figure.subject else ""
    limits = crossing.threshold.describe()
    if crossing.recovered:
        text = f"cdp metric recovered: {figure.metric}{where} is {figure.value:.1f} ({limits})"
    else:
        text = (
            f"cdp metric alert: {figure.metric}{where} is {figure.value:.1f}, past its alert"
            f" threshold ({limits})"
        )
    return {"text": text}


def alert_on_crossings(
    conn: psycopg.Connection,
    report: MetricsReport,
    url: str | None,
    log: logging.Logger | logging.LoggerAdapter,
) -> list[Crossing]:
    """Store each figure's severity, posting its crossing to `url` first when there is one.
    Returns the crossings stored (without a url they are stored unposted)."""
    keys = sorted((f.metric, f.subject) for f in report.figures)
    with conn.transaction():
        # Rows are created and locked in one order, so a concurrent evaluation (a manual
        # materialization during a scheduled one) waits and then sees this one's state.
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO cdp.ops_metric_states (metric, subject, severity)"
                " VALUES (%s, %s, 'ok') ON CONFLICT DO NOTHING",
                keys,
            )
        rows = conn.execute(
            "SELECT metric, subject, severity FROM cdp.ops_metric_states"
            " WHERE metric = ANY(%s) ORDER BY metric, subject FOR UPDATE",
            (sorted({metric for metric, _ in keys}),),
        ).fetchall()
        previous = {(metric, subject): Severity(severity) for metric, subject, severity in rows}
        found = crossings(previous, report)
        undelivered = {
            (c.figure.metric, c.figure.subject)
            for c in found
            if url and not post_alert(url, crossing_payload(c), log)
        }
        for figure in report.figures:
            key = (figure.metric, figure.subject)
            severity = previous[key] if key in undelivered else figure.severity
            conn.execute(
                "UPDATE cdp.ops_metric_states SET value = %s, evaluated_at = %s,"
                " changed_at = CASE WHEN severity = %s THEN changed_at ELSE %s END,"
                " severity = %s WHERE metric = %s AND subject = %s",
                (
                    figure.value,
                    report.checked_at,
                    str(severity),
                    report.checked_at,
                    str(severity),
                    *key,
                ),
            )
    return [c for c in found if (c.figure.metric, c.figure.subject) not in undelivered]
