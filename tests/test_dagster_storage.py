"""The instance's run storage and event log write over a pooled connection, not one connection
per statement, and ask the catalog once for what exists."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import dagster as dg
import pytest
from dagster._serdes import serialize_value
from sqlalchemy import event

from cdp_assets.lib.executor import PRELOADED


def test_storing_many_events_opens_a_connection_or_two_not_one_per_statement(instance):
    engine = instance.event_log_storage._engine
    connects = []

    def count(*_: object) -> None:
        connects.append(1)

    event.listen(engine, "connect", count)
    try:
        for n in range(30):
            instance.report_runless_asset_event(
                dg.AssetMaterialization(asset_key="pool_probe", metadata={"n": n})
            )
    finally:
        event.remove(engine, "connect", count)
    stored = instance.fetch_materializations(dg.AssetKey("pool_probe"), limit=100).records
    assert len(stored) == 30
    assert len(connects) <= 2  # dagster-postgres' own NullPool opened 3-4 per event


def test_asking_whether_a_table_exists_queries_the_catalog_once_per_table(instance):
    """Every asset check event asks whether the checks' table exists (a dbt build stores two
    per test); dagster-postgres asked the catalog each time."""
    engine = instance.event_log_storage._engine
    catalog_queries = []

    def count(_conn, _cursor, statement: str, *_: object) -> None:
        if "pg_catalog.pg_class" in statement or "pg_attribute" in statement:
            catalog_queries.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        for n in range(20):
            instance.report_runless_asset_event(
                dg.AssetCheckEvaluation(
                    asset_key=dg.AssetKey("table_probe"), check_name="probe", passed=n % 2 == 0
                )
            )
        assert instance.event_log_storage.has_table("no_such_table") is False
        assert instance.event_log_storage.has_table("no_such_table") is False
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert instance.event_log_storage.supports_asset_checks
    # At most the first check event's query, and each query for the missing table: a table
    # a migration may create later is asked again.
    assert 2 <= len(catalog_queries) <= 3


@dg.op
def probe_op() -> int:
    return 1


@dg.job
def probe_job() -> None:
    probe_op()


def test_runs_reuse_a_connection_and_ask_for_the_runs_columns_once(instance):
    """Adding a run and storing its run events asked dagster-postgres' run storage for a new
    connection per statement, and reflected the runs table (8 ms) before each write."""
    storage = instance.run_storage
    connects, catalog_queries = [], []

    def connected(*_: object) -> None:
        connects.append(1)

    def executed(_conn, _cursor, statement: str, *_: object) -> None:
        if "pg_attribute" in statement:
            catalog_queries.append(statement)

    event.listen(storage._engine, "connect", connected)
    event.listen(storage._engine, "before_cursor_execute", executed)
    try:
        for _ in range(3):
            assert probe_job.execute_in_process(instance=instance).success
        assert len(connects) <= 2
        asked = len(catalog_queries)
        assert asked <= 1
        # A column a migration may add later is asked again.
        assert storage.has_backfill_id_column()
        assert not storage._has_columns("runs", "no_such_column")
        assert not storage._has_columns("runs", "no_such_column")
        assert len(catalog_queries) == asked + 2
    finally:
        event.remove(storage._engine, "connect", connected)
        event.remove(storage._engine, "before_cursor_execute", executed)


# A process that imported `preloaded`, then created the instance from the ref on its stdin:
# the modules that creation imported, one per line.
_INSTANCE_IMPORTS = """
import importlib, sys
from dagster import DagsterInstance
from dagster._serdes import deserialize_value
importlib.import_module(sys.argv[1])
ref = deserialize_value(sys.stdin.read())
before = set(sys.modules)
DagsterInstance.from_ref(ref).dispose()
print("\\n".join(sorted(set(sys.modules) - before)))
"""
_STORAGE_PACKAGES = {"dagster", "dagster_postgres", "sqlalchemy", "psycopg2", "alembic"}


@pytest.mark.parametrize(
    ("preloaded", "imports_storage"),
    [(PRELOADED, False), ("cdp_assets.definitions", True)],
)
def test_processes_forked_from_the_preload_create_their_instance_without_importing_storage(
    instance, preloaded: str, imports_storage: bool
):
    created = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_INSTANCE_IMPORTS), preloaded],
        input=serialize_value(instance.get_ref()),
        capture_output=True,
        text=True,
        check=True,
    )
    imported = {name.split(".")[0] for name in created.stdout.split()}
    # The code location alone leaves Dagster's storage (hundreds of modules) to each process.
    assert bool(imported & _STORAGE_PACKAGES) is imports_storage, sorted(imported)
