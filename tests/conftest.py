"""Shared fixtures: a fresh database on the platform's Postgres, a Dagster instance stored in
it, and the VTEX sandbox in its own process."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import dagster as dg
import psycopg
import pytest

from cdp_assets.lib.database import database_url, sqlalchemy_url, with_database
from cdp_assets.lib.warehouse import migrated_url


@pytest.fixture(scope="session")
def warehouse_url() -> Iterator[str]:
    """A throwaway database (DATABASE_URL's server, or the embedded one), migrated."""
    server_url = database_url()
    name = f"cdp_test_{uuid.uuid4().hex[:10]}"
    url = with_database(server_url, name)
    migrated_url(url)
    os.environ["DATABASE_URL"] = url  # what resources and child processes pick up
    yield url
    os.environ["DATABASE_URL"] = server_url
    with psycopg.connect(with_database(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def conn(warehouse_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(warehouse_url) as connection:
        yield connection


@pytest.fixture(scope="session")
def instance(warehouse_url: str) -> Iterator[dg.DagsterInstance]:
    """A Dagster instance whose run and event storage is the test database."""
    overrides = {
        "storage": {"postgres": {"postgres_url": sqlalchemy_url(warehouse_url)}},
        "telemetry": {"enabled": False},
    }
    with dg.instance_for_test(overrides=overrides) as test_instance:
        yield test_instance
