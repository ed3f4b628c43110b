"""The sync history, `cdp.activation_runs`: its rows left open by runs that ended, and the
rows open now.

A sync opens its row as `running` and closes it when it ends, failures included. A run whose
process is killed mid-sync (out of memory, a redeploy, a lost node) never closes it: the next
activation run, of any tenant, marks such rows `abandoned` once Dagster says their run is over.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

import dagster as dg
import psycopg
from psycopg.types.json import Jsonb

# Set by Dagster on a failed run that its run retries will launch again.
WILL_RETRY_TAG = "dagster/will_retry"
FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
# A row without a Dagster run the instance knows (a sync run outside Dagster, or a run since
# deleted) is taken as abandoned once open this long: longer than any sync lasts.
UNTRACKED_HOURS = 24


def close_abandoned_runs(conn: psycopg.Connection, instance: dg.DagsterInstance) -> int:
    """Mark `abandoned` the rows still `running` whose Dagster run is over, and those open
    for UNTRACKED_HOURS without a run the instance knows; returns how many. Those of runs that
    failed for good, and those without a run, count as failures of their destination audience
    (`failures_in_a_row`). Committed."""
    run_ids = [
        run_id
        for (run_id,) in conn.execute(
            "SELECT DISTINCT dagster_run_id FROM cdp.activation_runs"
            " WHERE status = 'running' AND dagster_run_id IS NOT NULL"
        )
    ]
    records = instance.get_run_records(dg.RunsFilter(run_ids=run_ids)) if run_ids else []
    known = [record.dagster_run.run_id for record in records]
    ended = {
        record.dagster_run.run_id: record.dagster_run.status.value
        for record in records
        if record.dagster_run.status in FINISHED
    }
    closed = conn.execute(
        """
        UPDATE cdp.activation_runs SET status = 'abandoned', finished_at = now(),
               reason = CASE WHEN %(ended)s::jsonb ? dagster_run_id
                   THEN 'Dagster run ' || dagster_run_id || ' ended ('
                        || (%(ended)s::jsonb ->> dagster_run_id) || ') before this sync finished'
                   ELSE 'no Dagster run in progress for this sync after '
                        || %(hours)s || ' hours' END
        WHERE status = 'running'
          AND (%(ended)s::jsonb ? dagster_run_id
               OR (started_at < now() - make_interval(hours => %(hours)s)
                   AND (dagster_run_id IS NULL OR dagster_run_id <> ALL(%(known)s::text[]))))
        RETURNING destination_id, audience, started_at, dry_run, dagster_run_id
        """,
        {"ended": Jsonb(ended), "known": known, "hours": UNTRACKED_HOURS},
    ).fetchall()
    # A sync whose run failed for good (run monitoring ended it past its bound: a platform that
    # hangs), or that no run of the instance's holds, is a failure of its destination audience,
    # so one that hangs every time rests as one that fails does. Not a cancelled run's, nor a
    # crashed run's that Dagster retries, nor a dry run's.
    failed_for_good = {
        record.dagster_run.run_id
        for record in records
        if record.dagster_run.status == dg.DagsterRunStatus.FAILURE
        and record.dagster_run.tags.get(WILL_RETRY_TAG) != "true"
    }
    failures = [
        (destination_id, audience, started_at)
        for destination_id, audience, started_at, dry_run, run_id in closed
        if not dry_run and (run_id in failed_for_good or run_id not in known)
    ]
    if failures:
        destinations, audiences, started = (list(column) for column in zip(*failures, strict=True))
        # Its own statement, so a sync completed meanwhile (which clears the count) is seen.
        conn.execute(
            """
            UPDATE cdp.destination_audiences AS a
               SET failures_in_a_row = a.failures_in_a_row + failed.syncs, last_failed_at = now()
              FROM (SELECT c.destination_id, c.audience, count(*) AS syncs
                      FROM unnest(%s::text[], %s::text[], %s::timestamptz[])
                           AS c(destination_id, audience, started_at)
                     WHERE NOT EXISTS (
                           SELECT 1 FROM cdp.activation_runs AS later
                           WHERE later.destination_id = c.destination_id
                             AND later.audience = c.audience
                             AND later.status IN ('synced', 'failed')
                             AND later.started_at > c.started_at)
                     GROUP BY 1, 2) AS failed
             WHERE a.destination_id = failed.destination_id AND a.audience = failed.audience
            """,
            (destinations, audiences, started),
        )
    conn.commit()
    return len(closed)


@dataclass(frozen=True)
class OpenActivationRun:
    """A sync recorded as running, and for how long (by the database's clock)."""

    activation_run_id: int
    tenant_id: str
    destination_id: str
    audience: str
    platform: str
    dagster_run_id: str | None
    started_at: datetime
    age: timedelta


def open_activation_runs(
    conn: psycopg.Connection, tenant_ids: Collection[str] | None = None
) -> list[OpenActivationRun]:
    """The syncs recorded as running, of every tenant or of `tenant_ids`, oldest first."""
    rows = conn.execute(
        """
        SELECT activation_run_id, tenant_id, destination_id, audience, platform, dagster_run_id,
               started_at, now() - started_at
        FROM cdp.activation_runs
        WHERE status = 'running' AND (%(tenants)s::text[] IS NULL OR tenant_id = ANY(%(tenants)s))
        ORDER BY started_at, activation_run_id
        """,
        {"tenants": None if tenant_ids is None else list(tenant_ids)},
    ).fetchall()
    return [OpenActivationRun(*row) for row in rows]
