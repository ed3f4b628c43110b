"""Dagster's Postgres storage, with the event log keeping a connection open between writes.

dagster-postgres opens a new connection for every statement of its event log (SQLAlchemy's
NullPool), three or four per event. A run over many tenants' partitions stores thousands
of events (one planned and one materialization per asset and partition, one per dbt test):
41 tenants' dbt models are about 1,800 events, which spent 33 s storing them, most of it
connecting (2.7 ms each, and a server process forked per connection). Here the event log
keeps one connection and opens more only while threads write at once.

`dagster.yaml`:

    storage:
      custom:
        module: cdp_assets.lib.dagster_storage
        class: PooledPostgresStorage
        config:
          postgres_url: {env: CDP_DAGSTER_PG_URL}
"""

from __future__ import annotations

from typing import Any

from dagster._serdes import ConfigurableClassData
from dagster_postgres import DagsterPostgresStorage, PostgresEventLogStorage
from dagster_postgres.utils import (
    create_pg_engine,
    get_token_provider_from_config,
    pg_url_from_config,
)

# Connections the pool holds open, and how many more it may open while threads write at once.
POOL_SIZE = 1
MAX_OVERFLOW = 10
# Reconnect after an hour: a long-lived daemon outlives server-side idle timeouts.
POOL_RECYCLE_SECONDS = 3600


def _storage_args(config_value: Any) -> dict[str, Any]:
    """The constructor arguments of Dagster's Postgres storages, from their config."""
    return {
        "postgres_url": pg_url_from_config(config_value),
        "should_autocreate_tables": config_value.get("should_autocreate_tables", True),
        "token_provider": get_token_provider_from_config(config_value),
    }


class PooledPostgresEventLogStorage(PostgresEventLogStorage):
    def __init__(self, postgres_url: str, *args: Any, **kwargs: Any) -> None:
        self._tables_present: set[str] = set()
        super().__init__(postgres_url, *args, **kwargs)
        self._engine.dispose()
        self._engine = create_pg_engine(
            self.postgres_url,
            self._token_provider,
            isolation_level="AUTOCOMMIT",
            pool_size=POOL_SIZE,
            max_overflow=MAX_OVERFLOW,
            pool_recycle=POOL_RECYCLE_SECONDS,
            pool_pre_ping=True,
        )

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Any
    ) -> PooledPostgresEventLogStorage:
        return cls(**_storage_args(config_value), inst_data=inst_data)

    def has_table(self, table_name: str) -> bool:
        """Dagster asks whether a table of a later migration exists (asset checks, event tags)
        before storing many events, a catalog query each time. A table that exists stays; a
        missing one is asked again, since a migration may create it."""
        if table_name not in self._tables_present and super().has_table(table_name):
            self._tables_present.add(table_name)
        return table_name in self._tables_present

    def dispose(self) -> None:
        super().dispose()
        self._engine.dispose()


class PooledPostgresStorage(DagsterPostgresStorage):
    """`DagsterPostgresStorage` (same config) whose event log is pooled."""

    def __init__(
        self,
        postgres_url: str,
        should_autocreate_tables: bool = True,
        inst_data: ConfigurableClassData | None = None,
        token_provider: Any = None,
    ) -> None:
        super().__init__(postgres_url, should_autocreate_tables, inst_data, token_provider)
        self._event_log_storage = PooledPostgresEventLogStorage(
            postgres_url, should_autocreate_tables, token_provider=token_provider
        )

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Any
    ) -> PooledPostgresStorage:
        return cls(**_storage_args(config_value), inst_data=inst_data)

    @property
    def event_storage_data(self) -> ConfigurableClassData | None:
        return (
            ConfigurableClassData(
                __name__, PooledPostgresEventLogStorage.__name__, self.inst_data.config_yaml
            )
            if self.inst_data
            else None
        )


def storage_config(postgres_url: str) -> dict[str, Any]:
    """The instance's `storage` config (an override of `instance_for_test`, say)."""
    return {
        "custom": {
            "module": __name__,
            "class": PooledPostgresStorage.__name__,
            "config": {"postgres_url": postgres_url},
        }
    }
