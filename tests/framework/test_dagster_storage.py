"""The instance's run storage and event log write over a pooled connection, not one connection
per statement, and ask the catalog once for what exists."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import dagster as dg
import psycopg
import pytest
import sqlalchemy
from dagster._serdes import serialize_value
from sqlalchemy import event

from cdp_assets.framework.dagster_storage import PING_AFTER_IDLE_SECONDS
from cdp_assets.framework.executor import PRELOADED


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


def test_a_connection_is_pinged_only_after_sitting_idle_and_replaced_if_the_server_dropped_it(
    instance, warehouse_url, monkeypatch
):
    """Events written back to back reuse the pooled connection without a round trip first; one
    idle longer than PING_AFTER_IDLE_SECONDS is pinged, and one the server terminated is
    replaced before the write."""
    storage = instance.event_log_storage
    dialect = storage._engine.dialect
    pings = []
    ping = dialect.do_ping

    def counted(dbapi_connection) -> bool:
        pings.append(1)
        return ping(dbapi_connection)

    monkeypatch.setattr(dialect, "do_ping", counted)

    def materialize(n: int) -> None:
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key="ping_probe", metadata={"n": n})
        )

    materialize(0)
    time.sleep(PING_AFTER_IDLE_SECONDS * 2)
    pings.clear()
    for n in range(1, 21):
        materialize(n)
    # The first write after the pause pings; the 19 after it, back to back, do not.
    assert 1 <= len(pings) <= 2
    # The pool keeps one connection (POOL_SIZE): its server process is terminated.
    with storage._engine.connect() as pooled:
        pid = pooled.execute(sqlalchemy.text("SELECT pg_backend_pid()")).scalar()
    with psycopg.connect(warehouse_url, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    time.sleep(PING_AFTER_IDLE_SECONDS * 2)
    materialize(21)
    stored = instance.fetch_materializations(dg.AssetKey("ping_probe"), limit=100).records
    assert sorted(r.asset_materialization.metadata["n"].value for r in stored) == list(range(22))


batch_partitions = dg.StaticPartitionsDefinition(["p1", "p2", "p3", "p4"])


@dg.multi_asset(
    specs=[dg.AssetSpec("batch_probe_a"), dg.AssetSpec("batch_probe_b")],
    partitions_def=batch_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
)
def batch_probe(context):
    for key in context.selected_asset_keys:
        yield dg.MaterializeResult(
            asset_key=key, metadata={"partitions": len(context.partition_keys)}
        )


def test_a_run_over_partitions_writes_its_planned_and_done_events_in_batches(instance):
    """One planned event and one materialization per asset and partition, as before, in an
    INSERT for the run's planned events and one per asset for its materializations:
    dagster-postgres wrote a statement or more per event (1,230 events for 41 tenants'
    analytics)."""
    engine = instance.event_log_storage._engine
    inserts = []

    def executed(_conn, _cursor, statement: str, *_: object) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO EVENT_LOGS"):
            inserts.append(statement)

    job = dg.define_asset_job("batch_probe_job", [batch_probe])
    resolved = dg.Definitions(assets=[batch_probe], jobs=[job]).resolve_job_def("batch_probe_job")
    event.listen(engine, "before_cursor_execute", executed)
    try:
        result = resolved.execute_in_process(
            instance=instance,
            tags={
                "dagster/asset_partition_range_start": "p1",
                "dagster/asset_partition_range_end": "p4",
            },
        )
    finally:
        event.remove(engine, "before_cursor_execute", executed)
    assert result.success
    run_id = result.run_id
    planned = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED, limit=100
    ).records
    for key in (dg.AssetKey("batch_probe_a"), dg.AssetKey("batch_probe_b")):
        assert sorted(
            r.event_log_entry.dagster_event.event_specific_data.partition
            for r in planned
            if r.event_log_entry.dagster_event.asset_key == key
        ) == ["p1", "p2", "p3", "p4"]
        assert instance.get_materialized_partitions(key) == {"p1", "p2", "p3", "p4"}
        # The asset's entry names the run, as each planned event and materialization sets it.
        assert instance.get_asset_records([key])[0].asset_entry.last_run_id == run_id
    planned_info = instance.get_latest_planned_materialization_info(dg.AssetKey("batch_probe_a"))
    assert planned_info is not None and planned_info.run_id == run_id
    # The run's other events (start, steps, success) one INSERT each, as always.
    batched = {
        dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
        dg.DagsterEventType.ASSET_MATERIALIZATION,
    }
    others = [e for e in instance.all_logs(run_id) if e.dagster_event_type not in batched]
    assert len(inserts) == len(others) + 1 + 2


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
