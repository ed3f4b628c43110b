"""Dagster's Postgres storage, keeping connections open and remembering the schema.

dagster-postgres opens a new connection for every statement of its run storage and event log
(SQLAlchemy's NullPool), three or four per event. A run over many tenants' partitions stores
thousands of events (one planned and one materialization per asset and partition, one per dbt
test), most of whose storing time went to connecting (a server process forked per connection).
Here both keep one connection and open more only while threads write at once.

It also asks the catalog, before many writes, whether a table or a column of a later migration
exists: reflection of the whole table for a column, on every run it adds and every run event it
stores. What exists is remembered; what is missing is asked again, since `dagster instance
migrate` may add it.

Creating a pool at its instance's default limit is an upsert here. Dagster 1.13.27 INSERTs the
limit and UPDATEs it on a unique violation, in one transaction, which the violation has
already aborted on Postgres: setting the pools a second time on an instance (every start of
`cdp dev`), or two runs creating one pool at the same moment, failed.

And it writes a run's events over a range of partitions in batches: the planned
materializations a run records when it is created, and the materializations of each output, one
per asset and partition, took a statement or more each. Dagster batches the materializations
when `DAGSTER_EVENT_BATCH_SIZE` is set, which this event log sets unless the environment
already does; a batch of planned materializations, which dagster-postgres stores one by one, is
written here in one INSERT, with the planned evaluations of the asset's checks: each run the
orders schedule creates plans one month and two checks, one INSERT instead of three, and one
NOTIFY, per tenant of a tick.

A backfill of `vtex_orders` is stored as one backfill per tenant (`framework/backfills.py`), so
its runs keep to one tenant each whatever the shape of the selection.

`dagster.yaml`:

    storage:
      custom:
        module: cdp_assets.framework.dagster_storage
        class: PooledPostgresStorage
        config:
          postgres_url: {env: CDP_DAGSTER_PG_URL}
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import sqlalchemy as db
from dagster._core.events import DagsterEventType
from dagster._core.events.log import EventLogEntry
from dagster._core.execution.backfill import PartitionBackfill
from dagster._core.storage.event_log.schema import (
    AssetKeyTable,
    ConcurrencyLimitsTable,
    SqlEventLogStorageTable,
)
from dagster._core.storage.runs.schema import BulkActionsTable, RunsTable
from dagster._serdes import ConfigurableClassData
from dagster_postgres import (
    DagsterPostgresStorage,
    PostgresEventLogStorage,
    PostgresRunStorage,
    PostgresScheduleStorage,
)
from dagster_postgres.utils import (
    create_pg_connection,
    create_pg_engine,
    get_token_provider_from_config,
    pg_url_from_config,
)
from sqlalchemy import event, exc
from sqlalchemy.dialects.postgresql import insert as pg_insert

from cdp_assets.framework.backfills import per_tenant_backfills
from cdp_assets.lib import settings

# Connections the pool holds open, and how many more it may open while threads write at once.
POOL_SIZE = 1
MAX_OVERFLOW = 10
# Reconnect after an hour: a long-lived daemon outlives server-side idle timeouts.
POOL_RECYCLE_SECONDS = 3600
# A pooled connection idle this long is pinged before use, and replaced if the server dropped
# it (a restart, an idle timeout). A run writes its events back to back, each a checkout or
# two: a ping before every checkout (SQLAlchemy's pre_ping) was a round trip per statement,
# a tenth of an order sync's run. A server restarts in more than this.
PING_AFTER_IDLE_SECONDS = 0.25
# Events Dagster buffers before writing them in one batch (it reads the variable at each event).
EVENT_BATCH_SIZE_ENV = "DAGSTER_EVENT_BATCH_SIZE"
# What a run records when it is created, one per asset and partition and per asset check.
PLANNED_EVENTS = frozenset(
    {
        DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
        DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED,
    }
)
COLUMNS_SQL = db.text(
    "SELECT attname FROM pg_attribute"
    " WHERE attrelid = to_regclass(:table) AND attnum > 0 AND NOT attisdropped"
)


def _storage_args(config_value: Any) -> dict[str, Any]:
    """The constructor arguments of Dagster's Postgres storages, from their config."""
    return {
        "postgres_url": pg_url_from_config(config_value),
        "should_autocreate_tables": config_value.get("should_autocreate_tables", True),
        "token_provider": get_token_provider_from_config(config_value),
    }


def _pooled_engine(postgres_url: str, token_provider: Any) -> db.Engine:
    engine = create_pg_engine(
        postgres_url,
        token_provider,
        isolation_level="AUTOCOMMIT",
        pool_size=POOL_SIZE,
        max_overflow=MAX_OVERFLOW,
        pool_recycle=POOL_RECYCLE_SECONDS,
    )

    def checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["checked_in_at"] = time.monotonic()

    def checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        checked_in_at = record.info.pop("checked_in_at", None)
        if checked_in_at is None or time.monotonic() - checked_in_at < PING_AFTER_IDLE_SECONDS:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as error:
            # The pool discards the connection and checks out another (SQLAlchemy's
            # pessimistic disconnect handling).
            raise exc.DisconnectionError() from error

    event.listen(engine, "checkin", checked_in)
    event.listen(engine, "checkout", checked_out)
    return engine


class _PooledStorage:
    """A dagster-postgres storage (the class after this one in the bases) on a pooled engine,
    asking whether a table or its columns of a later migration exist in one catalog query of
    the table's column names (not a reflection of the table), and not again once they do."""

    _engine: db.Engine
    _token_provider: Any
    postgres_url: str

    def __init__(self, postgres_url: str, *args: Any, **kwargs: Any) -> None:
        # The columns of the tables known to exist.
        self._columns: dict[str, frozenset[str]] = {}
        super().__init__(postgres_url, *args, **kwargs)  # type: ignore[call-arg]
        self._engine.dispose()
        self._engine = _pooled_engine(self.postgres_url, self._token_provider)

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> Any:
        return cls(**_storage_args(config_value), inst_data=inst_data)

    def _columns_of(self, table: str, wanted: frozenset[str] = frozenset()) -> frozenset[str]:
        """The table's columns (none when it does not exist), asked again while the table or
        a `wanted` column is missing."""
        known = self._columns.get(table, frozenset())
        if not known or not wanted <= known:
            with create_pg_connection(self._engine) as conn:
                known = frozenset(conn.execute(COLUMNS_SQL, {"table": table}).scalars())
            if known:
                self._columns[table] = known
        return known

    def _has_columns(self, table: str, *columns: str) -> bool:
        wanted = frozenset(columns)
        return wanted <= self._columns_of(table, wanted)

    def dispose(self) -> None:
        super().dispose()  # type: ignore[misc]
        self._engine.dispose()


class PooledPostgresEventLogStorage(_PooledStorage, PostgresEventLogStorage):
    def __init__(self, postgres_url: str, *args: Any, **kwargs: Any) -> None:
        os.environ.setdefault(EVENT_BATCH_SIZE_ENV, settings.required(EVENT_BATCH_SIZE_ENV))
        super().__init__(postgres_url, *args, **kwargs)

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        planned = [e for e in events if e.dagster_event_type in PLANNED_EVENTS]
        if len(planned) > 1:
            self._store_planned_events(planned)
            events = [e for e in events if e.dagster_event_type not in PLANNED_EVENTS]
        if events:
            super().store_event_batch(events)

    def _store_planned_events(self, events: Sequence[EventLogEntry]) -> None:
        """What `store_event` does for each, in one INSERT and one index transaction: each
        asset's entry records its last planned event (the run that will materialize it), and
        each planned check evaluation its execution row."""
        with self._connect() as conn:
            event_ids: list[int] = list(
                conn.execute(
                    self.prepare_insert_event_batch(events).returning(SqlEventLogStorageTable.c.id)
                ).scalars()
            )
        stored = list(zip(events, event_ids, strict=True))
        materializations = [
            (event, event_id)
            for event, event_id in stored
            if event.dagster_event_type == DagsterEventType.ASSET_MATERIALIZATION_PLANNED
        ]
        last_of_asset = {
            event.get_dagster_event().asset_key: (event, event_id)
            for event, event_id in materializations
        }
        with self.index_transaction() as conn:
            self._store_asset_event_tags(
                conn, [event for event, _ in materializations], [i for _, i in materializations]
            )
            for event, event_id in last_of_asset.values():
                self._store_asset_event(conn, event, event_id)
        for event, event_id in stored:
            if event.dagster_event_type == DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED:
                self.store_asset_check_event(event, event_id)

    def initialize_concurrency_limit_to_default(self, concurrency_key: str) -> bool:
        """The pool at the instance's default limit, unless an operator set its limit: one
        INSERT ... ON CONFLICT, safe to repeat and to race."""
        default_limit = (
            self._instance.global_op_concurrency_default_limit if self.has_instance else None
        )
        if default_limit is None or not self.has_default_pool_limit_col:
            return super().initialize_concurrency_limit_to_default(concurrency_key)
        self._reconcile_concurrency_limits_from_slots()
        limits = ConcurrencyLimitsTable
        upsert = (
            pg_insert(limits)
            .values(concurrency_key=concurrency_key, limit=default_limit, using_default_limit=True)
            .on_conflict_do_update(
                index_elements=[limits.c.concurrency_key],
                set_={"limit": default_limit},
                where=limits.c.using_default_limit,
            )
            .returning(limits.c.id)
        )
        with self.index_transaction() as conn:
            if conn.execute(upsert).first() is not None:
                self._allocate_concurrency_slots(conn, concurrency_key, default_limit)
        return True

    def has_table(self, table_name: str) -> bool:
        # Asked before storing each asset check event (two per dbt test) and each event with
        # indexed tags.
        return bool(self._columns_of(table_name))

    @cached_property
    def has_default_pool_limit_col(self) -> bool:
        # Asked by the first step of every run that claims a pool slot.
        return self._has_columns(
            ConcurrencyLimitsTable.name, ConcurrencyLimitsTable.c.using_default_limit.name
        )

    def has_asset_key_col(self, column_name: str) -> bool:
        return self._has_columns(AssetKeyTable.name, column_name)


class PooledPostgresRunStorage(_PooledStorage, PostgresRunStorage):
    def __init__(self, postgres_url: str, *args: Any, **kwargs: Any) -> None:
        # Snapshots known to be stored. One is stored under the hash of its content and never
        # changes, and every run created asks for its job's and its plan's (the plan's by
        # reading and decompressing it whole): hundreds of times per tick of the orders
        # schedule, for the same two.
        self._stored_snapshots: set[str] = set()
        super().__init__(postgres_url, *args, **kwargs)

    def has_job_snapshot(self, job_snapshot_id: str) -> bool:
        return self._snapshot_stored(job_snapshot_id, super().has_job_snapshot)

    def has_execution_plan_snapshot(self, execution_plan_snapshot_id: str) -> bool:
        return self._snapshot_stored(
            execution_plan_snapshot_id, super().has_execution_plan_snapshot
        )

    def _snapshot_stored(self, snapshot_id: str, ask: Callable[[str], bool]) -> bool:
        if snapshot_id not in self._stored_snapshots and ask(snapshot_id):
            self._stored_snapshots.add(snapshot_id)
        return snapshot_id in self._stored_snapshots

    def wipe(self) -> None:
        super().wipe()
        self._stored_snapshots.clear()

    # Every backfill passes here, the UI's included: orders run one tenant at a time.
    def add_backfill(self, partition_backfill: PartitionBackfill) -> None:
        for backfill in per_tenant_backfills(partition_backfill):
            super().add_backfill(backfill)

    # Asked on every run added (backfill_id) and every run event stored (run stats).
    def has_run_stats_index_cols(self) -> bool:
        return self._has_columns(RunsTable.name, "start_time", "end_time")

    def has_backfill_id_column(self) -> bool:
        return self._has_columns(RunsTable.name, "backfill_id")

    def has_bulk_actions_selector_cols(self) -> bool:
        return self._has_columns(BulkActionsTable.name, "selector_id")

    def has_bulk_action_job_name_column(self) -> bool:
        return self._has_columns(BulkActionsTable.name, "job_name")


class PooledPostgresStorage(DagsterPostgresStorage):
    """`DagsterPostgresStorage` (same config) whose run storage and event log are pooled."""

    def __init__(
        self,
        postgres_url: str,
        should_autocreate_tables: bool = True,
        inst_data: ConfigurableClassData | None = None,
        token_provider: Any = None,
    ) -> None:
        # Not DagsterPostgresStorage's constructor: it builds dagster-postgres' own run storage
        # and event log (an engine and a listing of the tables each), to be replaced here.
        self.postgres_url = postgres_url
        self.should_autocreate_tables = should_autocreate_tables
        self._inst_data = inst_data
        storage_args = (postgres_url, should_autocreate_tables)
        self._run_storage = PooledPostgresRunStorage(*storage_args, token_provider=token_provider)
        self._event_log_storage = PooledPostgresEventLogStorage(
            *storage_args, token_provider=token_provider
        )
        self._schedule_storage = PostgresScheduleStorage(
            *storage_args, token_provider=token_provider
        )
        super(DagsterPostgresStorage, self).__init__()

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Any
    ) -> PooledPostgresStorage:
        return cls(**_storage_args(config_value), inst_data=inst_data)

    def _storage_data(self, storage: type) -> ConfigurableClassData | None:
        return (
            ConfigurableClassData(__name__, storage.__name__, self.inst_data.config_yaml)
            if self.inst_data
            else None
        )

    @property
    def event_storage_data(self) -> ConfigurableClassData | None:
        return self._storage_data(PooledPostgresEventLogStorage)

    @property
    def run_storage_data(self) -> ConfigurableClassData | None:
        return self._storage_data(PooledPostgresRunStorage)


def storage_config(postgres_url: str) -> dict[str, Any]:
    """The instance's `storage` config (an override of `instance_for_test`, say)."""
    return {
        "custom": {
            "module": __name__,
            "class": PooledPostgresStorage.__name__,
            "config": {"postgres_url": postgres_url},
        }
    }
