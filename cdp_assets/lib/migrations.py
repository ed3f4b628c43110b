"""Versioned SQL migrations: each file in `migrations/` is applied once, in name order."""

from __future__ import annotations

import threading
from importlib.resources import files

import psycopg

from cdp_assets.lib.database import database_url, ensure_database

# Any constant works; it only has to be the same in every process that migrates.
_MIGRATION_LOCK = 727_001


def migration_files() -> list[tuple[str, str]]:
    folder = files("cdp_assets.lib") / "migrations"
    sql_files = sorted(
        (p for p in folder.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name
    )
    return [(p.name.removesuffix(".sql"), p.read_text()) for p in sql_files]


def migrate(url: str) -> list[str]:
    """Apply the pending migrations; returns the versions applied by this call."""
    ensure_database(url)
    applied_now: list[str] = []
    with psycopg.connect(url) as conn:
        # Serializes concurrent migrators (webserver, daemon and runs starting together).
        conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS public.cdp_schema_migrations"
            " (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.commit()
        done = {row[0] for row in conn.execute("SELECT version FROM public.cdp_schema_migrations")}
        for version, sql in migration_files():
            if version in done:
                continue
            with conn.transaction():
                conn.execute(sql)
                conn.execute(
                    "INSERT INTO public.cdp_schema_migrations (version) VALUES (%s)", (version,)
                )
            applied_now.append(version)
        conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
    return applied_now


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
