"""Maintenance: records past their retention are deleted, and the planner's statistics of the
big tables refreshed. The nightly `maintenance_job` (ops/jobs.py) runs it; `cdp maintenance
--dry-run` says what it would remove.

Each kind of record is kept for its number of days (its setting CDP_RETENTION_<NAME>_DAYS,
declared with its default in cdp_assets/lib/settings.py), counted from when it was last
touched. Two kinds of rows stay whatever their age: each destination audience's latest
synced run (its match figures are shown until the next sync), and a Dagster run that
materialized an asset (Dagster plans from the materializations: which partitions exist,
what is stale). Privacy requests are kept for good: they are the proof a request was
honoured. The folders the platform's dbt invocations leave in `dbt_project/target/` (their
`dbt.log` and compiled SQL) go by the folder's last change (a command's end), on the machine
the job runs on.
"""

import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
import dagster as dg
import psycopg
from psycopg import sql

from cdp_assets.analytics.dbt_files import DBT_TARGET_DIR, invocation_folders, modified_at
from cdp_assets.lib import settings
from cdp_assets.lib.migrations import migrated_url


@dataclass(frozen=True)
class Retention:
    name: str
    table: str
    age_column: str
    # Rows kept whatever their age.
    keep: str = "false"

    @property
    def setting(self) -> str:
        return f"CDP_RETENTION_{self.name.upper()}_DAYS"


RETENTIONS = (
    Retention("rejects", "raw_vtex.rejects", "last_seen_at"),
    Retention("unreadable_orders", "raw_vtex.unreadable_orders", "last_seen_at"),
    Retention("orders_to_reread", "raw_vtex.orders_to_reread", "last_failed_at"),
    Retention(
        "activation_runs",
        "cdp.activation_runs",
        "finished_at",
        keep="activation_run_id IN (SELECT max(activation_run_id) FROM cdp.activation_runs"
        " WHERE status = 'synced' GROUP BY destination_id, audience)",
    ),
    Retention("activation_rejects", "cdp.activation_rejects", "rejected_at"),
    # A request awaiting the platform's verdict has no settled_at: it stays whatever its age.
    Retention("destination_requests", "cdp.destination_requests", "settled_at"),
    Retention("sync_errors", "cdp.sync_errors", "occurred_at"),
    Retention("metric_states", "cdp.ops_metric_states", "evaluated_at"),
)
DAGSTER_RUNS = Retention("dagster_runs", "Dagster runs and their event logs", "end time")
DBT_OUTPUT = Retention("dbt_output", "dbt invocation folders", "last change")
EVERY_RETENTION = (*RETENTIONS, DAGSTER_RUNS, DBT_OUTPUT)
# What most scans read; autovacuum analyzes them late after a bulk load or a mass deletion.
ANALYZED = (
    "raw_vtex.orders",
    "raw_vtex.customers",
    "raw_vtex.products",
    "raw_vtex.skus",
    "cdp.destination_members",
    "cdp.activation_runs",
)
# Runs looked at per maintenance: each costs a query for its materializations.
RUNS_PER_MAINTENANCE = 5_000
FINISHED = [
    dg.DagsterRunStatus.SUCCESS,
    dg.DagsterRunStatus.FAILURE,
    dg.DagsterRunStatus.CANCELED,
]


class RetentionError(ValueError):
    """A retention setting that is not a positive number of days."""


def retention_days(retention: Retention) -> int:
    text = settings.required(retention.setting)
    if not text.isdigit() or int(text) < 1:
        raise RetentionError(f"{retention.setting} must be a number of days (1 or more)")
    return int(text)


@dataclass(frozen=True)
class Pruned:
    name: str
    days: int
    rows: int


def _prune_table(
    conn: psycopg.Connection, retention: Retention, cutoff: datetime, dry_run: bool
) -> int:
    schema, table = retention.table.split(".")
    where = sql.SQL("{age} < %(cutoff)s AND NOT ({keep})").format(
        age=sql.Identifier(retention.age_column), keep=sql.SQL(retention.keep)
    )
    relation = sql.Identifier(schema, table)
    if dry_run:
        query = sql.SQL("SELECT count(*) FROM {} WHERE {}").format(relation, where)
        row = conn.execute(query, {"cutoff": cutoff}).fetchone()
        return row[0] if row else 0
    query = sql.SQL("DELETE FROM {} WHERE {}").format(relation, where)
    return conn.execute(query, {"cutoff": cutoff}).rowcount


def _prune_dagster_runs(instance: dg.DagsterInstance, cutoff: datetime, dry_run: bool) -> int:
    """Finished runs updated last before `cutoff` that materialized nothing, deleted with their
    event logs through Dagster's own API."""
    records = instance.get_run_records(
        dg.RunsFilter(statuses=FINISHED, updated_before=cutoff),
        limit=RUNS_PER_MAINTENANCE,
        ascending=True,
    )
    pruned = 0
    for record in records:
        run_id = record.dagster_run.run_id
        materialized = instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION, limit=1
        ).records
        if materialized:
            continue
        if not dry_run:
            instance.delete_run(run_id)
        pruned += 1
    return pruned


def _prune_dbt_output(target: Path, cutoff: datetime, dry_run: bool) -> int:
    """The platform's dbt invocation folders in `target` last changed before `cutoff` (one
    another process removed meanwhile, modified at 0, is not counted)."""
    old = [p for p in invocation_folders(target) if 0 < modified_at(p) < cutoff.timestamp()]
    if not dry_run:
        for path in old:
            shutil.rmtree(path, ignore_errors=True)
    return len(old)


def run_maintenance(
    conn: psycopg.Connection,
    instance: dg.DagsterInstance | None,
    *,
    dry_run: bool = False,
    now: datetime | None = None,
    dbt_output: Path = DBT_TARGET_DIR,
) -> list[Pruned]:
    """Prune every kind of record past its retention (the warehouse's in one transaction),
    then ANALYZE the big tables; what was (or would be) removed. Without `instance`, Dagster's
    runs are left alone; the dbt invocations' folders are those in `dbt_output`."""
    now = now or datetime.now(UTC)
    # Every setting read before anything is removed: a bad one stops the whole maintenance.
    days = {r.name: retention_days(r) for r in EVERY_RETENTION}

    def cutoff(retention: Retention) -> datetime:
        return now - timedelta(days=days[retention.name])

    def pruned_of(retention: Retention, removed: int) -> Pruned:
        return Pruned(retention.name, days[retention.name], removed)

    pruned = [pruned_of(r, _prune_table(conn, r, cutoff(r), dry_run)) for r in RETENTIONS]
    conn.commit()
    if instance is not None:
        runs = _prune_dagster_runs(instance, cutoff(DAGSTER_RUNS), dry_run)
        pruned.append(pruned_of(DAGSTER_RUNS, runs))
    folders = _prune_dbt_output(dbt_output, cutoff(DBT_OUTPUT), dry_run)
    pruned.append(pruned_of(DBT_OUTPUT, folders))
    if not dry_run:
        for table in ANALYZED:
            conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(*table.split("."))))
        conn.commit()
    return pruned


def report_maintenance(dry_run: bool) -> None:
    """`cdp maintenance`: the nightly job's work now, on the platform's database and instance,
    printed."""
    from cdp_assets.ops.status import platform_instance

    url = migrated_url()
    try:
        with platform_instance(url) as instance, psycopg.connect(url) as conn:
            pruned = run_maintenance(conn, instance, dry_run=dry_run)
    except RetentionError as error:
        raise click.ClickException(str(error)) from None
    verb = "would remove" if dry_run else "removed"
    for item in pruned:
        click.echo(f"{item.name:<20}{verb} {item.rows:>8}  (older than {item.days} days)")
