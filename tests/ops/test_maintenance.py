"""Maintenance: every kind of record past its retention is deleted, nothing younger, and a
second run finds nothing more; a dry run says the same and deletes nothing."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import pytest

from cdp_assets.definitions import defs
from cdp_assets.ops.jobs import MAINTENANCE_JOB
from cdp_assets.ops.maintenance import (
    ANALYZED,
    DAGSTER_RUNS,
    DBT_OUTPUT,
    RETENTIONS,
    RetentionError,
    retention_days,
    run_maintenance,
)
from cdp_assets.ops.schedules import maintenance_schedule

# What the tests below give the maintenance as dbt's output folder: none, never created. The
# checkout's own (the default) holds the dbt folders of the developer and of the tests beside.
NO_DBT_OUTPUT = Path(__file__).with_name("no_dbt_output")


def maintain(conn: psycopg.Connection, **options: Any) -> list:
    """The maintenance of the warehouse alone (no Dagster instance), on NO_DBT_OUTPUT."""
    return run_maintenance(conn, None, dbt_output=NO_DBT_OUTPUT, **options)


# Per kind of record: how to insert one last touched at %(at)s, marked %(mark)s.
INSERTS = {
    "rejects": "INSERT INTO raw_vtex.rejects (tenant_id, entity, natural_key, reason, raw_text,"
    " raw_md5, first_seen_at, last_seen_at) VALUES ('maint', 'orders', %(mark)s, 'bad', '{}',"
    " md5(%(mark)s), %(at)s, %(at)s)",
    "unreadable_orders": "INSERT INTO raw_vtex.unreadable_orders (tenant_id, order_id, month,"
    " error, first_seen_at, last_seen_at) VALUES ('maint', %(mark)s, '2025-01-01', '500',"
    " %(at)s, %(at)s)",
    "orders_to_reread": "INSERT INTO raw_vtex.orders_to_reread (tenant_id, order_id, attempts,"
    " last_error, first_failed_at, last_failed_at) VALUES ('maint', %(mark)s, 3, '404', %(at)s,"
    " %(at)s)",
    "activation_runs": "INSERT INTO cdp.activation_runs (destination_id, audience, tenant_id,"
    " platform, mode, dry_run, status, reason, started_at, finished_at) VALUES ('maint_dest',"
    " %(mark)s, 'maint', 'meta', 'diff', false, 'failed', %(mark)s, %(at)s, %(at)s)",
    "activation_rejects": "INSERT INTO cdp.activation_rejects (activation_run_id, member_key,"
    " operation, reason, rejected_at) SELECT max(activation_run_id), %(mark)s, 'add', 'invalid',"
    " %(at)s FROM cdp.activation_runs WHERE reason = 'recent'",
    "sync_errors": "INSERT INTO cdp.sync_errors (run_id, tenant_id, job_name, error_type, message,"
    " occurred_at) VALUES (%(mark)s, 'maint', 'job', 'Failure', 'failed', %(at)s)",
    "destination_requests": "INSERT INTO cdp.destination_requests (destination_id, audience,"
    " platform_request_id, operation, status, sent_at, settled_at) VALUES ('maint_dest',"
    " 'maint_audience', %(mark)s, 'add', 'confirmed', %(at)s, %(at)s)",
    "metric_states": "INSERT INTO cdp.ops_metric_states (metric, subject, severity, changed_at,"
    " evaluated_at) VALUES ('maint', %(mark)s, 'ok', %(at)s, %(at)s)",
}
MARK_COLUMN = {
    "rejects": "natural_key",
    "unreadable_orders": "order_id",
    "orders_to_reread": "order_id",
    "activation_runs": "audience",
    "activation_rejects": "member_key",
    "sync_errors": "run_id",
    "destination_requests": "platform_request_id",
    "metric_states": "subject",
}


def _marks(conn: psycopg.Connection, name: str) -> set[str]:
    (retention,) = [r for r in RETENTIONS if r.name == name]
    return {
        mark
        for (mark,) in conn.execute(
            f"SELECT {MARK_COLUMN[name]} FROM {retention.table}"
            f" WHERE {MARK_COLUMN[name]} LIKE 'maint-%%'"
        )
    }


@pytest.fixture
def aged_rows(conn: psycopg.Connection) -> dict[str, tuple[str, str]]:
    """Per kind: (mark of a row a day past its retention, mark of one a day short of it)."""
    now = datetime.now(UTC)
    conn.execute(
        "INSERT INTO cdp.tenants (tenant_id, account_name, app_key_ref, app_token_ref)"
        " VALUES ('maint', 'maint', 'MAINT_KEY', 'MAINT_TOKEN') ON CONFLICT DO NOTHING"
    )
    conn.execute(
        "INSERT INTO cdp.destinations (destination_id, tenant_id, platform, account_id)"
        " VALUES ('maint_dest', 'maint', 'meta', '77') ON CONFLICT DO NOTHING"
    )
    conn.execute(
        "INSERT INTO cdp.destination_audiences (destination_id, audience)"
        " VALUES ('maint_dest', 'maint_audience') ON CONFLICT DO NOTHING"
    )
    # A request still awaiting its verdict, sent long before any retention: it stays.
    conn.execute(
        "INSERT INTO cdp.destination_requests (destination_id, audience, platform_request_id,"
        " operation, sent_at) VALUES ('maint_dest', 'maint_audience', 'maint-pending', 'add',"
        " now() - interval '3 years')"
    )
    conn.execute(
        "INSERT INTO cdp.activation_runs (destination_id, audience, tenant_id, platform,"
        " mode, dry_run, status, reason, finished_at) VALUES ('maint_dest', 'anchor',"
        " 'maint', 'meta', 'diff', false, 'failed', 'recent', now())"
    )
    rows = {}
    for retention in RETENTIONS:
        days = retention_days(retention)
        old, young = f"maint-{uuid.uuid4().hex}", f"maint-{uuid.uuid4().hex}"
        for mark, age in ((old, days + 1), (young, days - 1)):
            conn.execute(INSERTS[retention.name], {"mark": mark, "at": now - timedelta(days=age)})
        rows[retention.name] = (old, young)
    conn.commit()
    return rows


def test_maintenance_removes_only_rows_past_their_retention_and_is_idempotent(
    conn: psycopg.Connection, aged_rows: dict[str, tuple[str, str]]
) -> None:
    pruned = {p.name: p.rows for p in maintain(conn)}

    for name, (old, young) in aged_rows.items():
        left = _marks(conn, name)
        assert old not in left, name
        assert young in left, name
        assert pruned[name] >= 1, name
    assert "maint-pending" in _marks(conn, "destination_requests")
    again = {p.name: p.rows for p in maintain(conn)}
    assert again == dict.fromkeys(again, 0)


def test_maintenance_refreshes_the_planner_statistics_of_the_big_tables(
    conn: psycopg.Connection,
) -> None:
    counts = "SELECT relname, analyze_count FROM pg_stat_user_tables WHERE relid = ANY(%s)"
    oids = [conn.execute("SELECT %s::regclass::oid", (t,)).fetchone()[0] for t in ANALYZED]
    conn.execute("SELECT pg_stat_clear_snapshot()")
    before = dict(conn.execute(counts, (oids,)).fetchall())
    conn.commit()

    maintain(conn)

    conn.execute("SELECT pg_stat_clear_snapshot()")
    after = dict(conn.execute(counts, (oids,)).fetchall())
    assert len(after) == len(ANALYZED)
    assert all(after[name] == before.get(name, 0) + 1 for name in after), (before, after)


def test_a_dry_run_counts_what_maintenance_would_remove_and_removes_nothing(
    conn: psycopg.Connection, aged_rows: dict[str, tuple[str, str]]
) -> None:
    before = {name: _marks(conn, name) for name in aged_rows}

    would = {p.name: p.rows for p in maintain(conn, dry_run=True)}

    assert {name: _marks(conn, name) for name in aged_rows} == before
    removed = {p.name: p.rows for p in maintain(conn)}
    assert would == removed


def test_the_latest_synced_run_of_each_audience_is_kept_whatever_its_age(
    conn: psycopg.Connection,
) -> None:
    audience = f"maint-{uuid.uuid4().hex}"
    long_ago = datetime.now(UTC) - timedelta(days=3 * 365)
    for status, reason in (("synced", "older"), ("synced", "latest"), ("failed", "after")):
        conn.execute(
            "INSERT INTO cdp.activation_runs (destination_id, audience, tenant_id, platform, mode,"
            " dry_run, status, reason, started_at, finished_at) VALUES ('maint_keep', %s,"
            " 'maint', 'meta', 'diff', false, %s, %s, %s, %s)",
            (audience, status, reason, long_ago, long_ago),
        )
    conn.commit()

    maintain(conn)

    kept = conn.execute(
        "SELECT reason FROM cdp.activation_runs WHERE audience = %s", (audience,)
    ).fetchall()
    assert kept == [("latest",)]


def test_a_retention_setting_overrides_the_default_and_a_bad_one_is_refused(
    conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    (rejects,) = [r for r in RETENTIONS if r.name == "rejects"]
    mark = f"maint-{uuid.uuid4().hex}"
    conn.execute(INSERTS["rejects"], {"mark": mark, "at": datetime.now(UTC) - timedelta(days=10)})
    conn.commit()
    monkeypatch.setenv(rejects.setting, "30")
    maintain(conn)
    assert mark in _marks(conn, "rejects")

    monkeypatch.setenv(rejects.setting, "7")
    maintain(conn)
    assert mark not in _marks(conn, "rejects")

    monkeypatch.setenv(rejects.setting, "0")
    with pytest.raises(RetentionError, match=rejects.setting):
        maintain(conn)


@dg.asset
def maintenance_test_asset() -> int:
    return 1


def test_old_dagster_runs_that_materialized_nothing_are_deleted_with_their_events(
    conn: psycopg.Connection, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    # The platform's own nightly job: a run that materializes nothing.
    nothing = defs.resolve_job_def(MAINTENANCE_JOB).execute_in_process(instance=instance)
    materialized = dg.materialize([maintenance_test_asset], instance=instance)
    assert nothing.success and materialized.success
    later = datetime.now(UTC) + timedelta(days=retention_days(DAGSTER_RUNS) + 1)

    # Months ahead, the project's dbt folders would all be past their retention: those of
    # the runs going on beside this test too.
    beside = {"dbt_output": tmp_path}
    would = {
        p.name: p.rows for p in run_maintenance(conn, instance, dry_run=True, now=later, **beside)
    }
    assert instance.has_run(nothing.run_id)
    pruned = {p.name: p.rows for p in run_maintenance(conn, instance, now=later, **beside)}

    assert pruned["dagster_runs"] == would["dagster_runs"] >= 1
    assert not instance.has_run(nothing.run_id)
    assert not instance.all_logs(nothing.run_id)
    assert instance.has_run(materialized.run_id)
    assert instance.get_latest_materialization_event(maintenance_test_asset.key) is not None
    again = {p.name: p.rows for p in run_maintenance(conn, instance, now=later, **beside)}
    assert again["dagster_runs"] == 0


def test_the_maintenance_job_runs_every_night_by_default() -> None:
    schedule = defs.resolve_schedule_def(maintenance_schedule.name)
    assert schedule.job_name == MAINTENANCE_JOB
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert schedule.cron_schedule == "30 3 * * *"


def test_maintenance_removes_the_platforms_dbt_folders_past_their_retention(
    conn: psycopg.Connection, tmp_path: Path
) -> None:
    """Each of the platform's dbt commands leaves a folder (dagster-dbt's `<step>-<run>-<id>`)
    for its log; those past the retention go, nothing else in dbt's target folder does."""
    days = retention_days(DBT_OUTPUT)
    now = datetime.now(UTC)
    ages = {
        "dbt_tenant_models-1a2b3c4-5d6e7f8": days + 1,
        "dbt_audiences-1a2b3c4-0a9b8c7": days - 1,
        "production": days + 30,  # the project's kept parses and production's manifest
        f"parse-{uuid.uuid4().hex}": days + 30,  # a parse under way
        "my_own_target": days + 30,  # a person's
    }
    for name, age in ages.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "dbt.log").write_text("...")
        written = (now - timedelta(days=age)).timestamp()
        os.utime(folder, (written, written))

    would = {p.name: p.rows for p in run_maintenance(conn, None, dry_run=True, dbt_output=tmp_path)}
    assert would[DBT_OUTPUT.name] == 1
    assert {path.name for path in tmp_path.iterdir()} == set(ages)
    pruned = {p.name: p.rows for p in run_maintenance(conn, None, dbt_output=tmp_path)}
    assert pruned[DBT_OUTPUT.name] == 1
    assert {path.name for path in tmp_path.iterdir()} == set(ages) - {
        "dbt_tenant_models-1a2b3c4-5d6e7f8"
    }
