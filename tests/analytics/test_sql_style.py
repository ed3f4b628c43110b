"""The dbt project's SQL keeps one style: sqlfluff with dbt's templater (dbt_project/.sqlfluff)
finds nothing in its models and singular tests, compiled against an empty database (as a first
build renders them: what a model renders depends on whether its table exists)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cdp_assets.analytics.dbt_files import DBT_PROJECT_DIR, dbt_connection_env
from cdp_assets.lib.database import database_url, with_database


@pytest.fixture
def empty_database() -> Iterator[str]:
    server = database_url()
    name = f"cdp_lint_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(with_database(server, "postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield with_database(server, name)
    with psycopg.connect(with_database(server, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_sqlfluff_finds_nothing_in_the_dbt_project(empty_database: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        **dbt_connection_env(empty_database),
        # dbt's own output goes elsewhere than the project's target/, which runs share.
        "DBT_TARGET_PATH": str(tmp_path / "target"),
        "DO_NOT_TRACK": "1",
    }
    linted = subprocess.run(
        [str(Path(sys.executable).parent / "sqlfluff"), "lint", "models", "tests"],
        cwd=DBT_PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert linted.returncode == 0, linted.stdout[-4000:] + linted.stderr[-2000:]
    assert "All Finished" in linted.stdout
