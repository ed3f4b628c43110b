"""The warehouse as a Dagster resource: a Postgres connection with the schema migrated."""

import dagster as dg
import psycopg

from cdp_assets.lib.database import connect
from cdp_assets.lib.migrations import migrated_url


class WarehouseResource(dg.ConfigurableResource):
    """Postgres holding `cdp.*` and `raw_vtex.*`; `url` defaults to the platform's database."""

    url: str | None = None

    def url_migrated(self) -> str:
        return migrated_url(self.url)

    def connect(self) -> psycopg.Connection:
        """A session bounded in time (lib/database.py): connect and statement timeouts."""
        return connect(self.url_migrated())
