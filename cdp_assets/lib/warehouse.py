"""The warehouse as a Dagster resource: a Postgres connection with the schema migrated."""

import threading

import dagster as dg
import psycopg

from cdp_assets.lib.database import connect, database_url
from cdp_assets.lib.migrations import migrate

_migrated: set[str] = set()
_migrate_lock = threading.Lock()


def migrated_url(url: str | None = None) -> str:
    """The warehouse URL, with the migrations applied once per process."""
    url = url or database_url()
    with _migrate_lock:
        if url not in _migrated:
            migrate(url)
            _migrated.add(url)
    return url


class WarehouseResource(dg.ConfigurableResource):
    """Postgres holding `cdp.*` and `raw_vtex.*`; `url` defaults to the platform's database."""

    url: str | None = None

    def url_migrated(self) -> str:
        return migrated_url(self.url)

    def connect(self) -> psycopg.Connection:
        """A session bounded in time (lib/database.py): connect and statement timeouts."""
        return connect(self.url_migrated())
