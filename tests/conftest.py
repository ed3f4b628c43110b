"""Shared fixtures: a fresh database on the platform's Postgres, a Dagster instance stored in
it, and the reliability report; and how test files share the xdist workers."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg
import pytest
from support.reliability_report import Report

from cdp_assets.framework.dagster_storage import storage_config
from cdp_assets.lib.database import database_url, sqlalchemy_url, with_database
from cdp_assets.lib.migrations import migrated_url

# The suite waits mostly on processes (Dagster runs, dbt, sandboxes), so it runs on four
# xdist workers (`-n 4` in pyproject.toml), more than a 2-core machine's cores. A worker takes
# a test file whole, so the file's module fixtures are built once; files that share a session
# fixture go to one worker together. The longest files are handed out first, so the workers
# finish together.
SAME_WORKER = {  # file -> the session fixture it shares
    "test_tenant_isolation.py": "shared_pipeline",
    "test_secrets_and_pii.py": "shared_pipeline",
}
LONGEST_FIRST = (
    "test_quick_start.py",
    "test_bench.py",
    "test_tenant_isolation.py",
    "test_secrets_and_pii.py",
    "test_analytics.py",
    "test_ui.py",
    "test_analyst_workflow.py",
    "test_activation_meta.py",
    "test_automation.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: a file's tests keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        """xdist's `loadfile`, with the files of SAME_WORKER grouped, in collection order."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SAME_WORKER.get(Path(path).name, path)

    config.option.loadscopereorder = False  # keep LONGEST_FIRST's order
    return FileScheduling(config, log)


_reliability = Report()
RELIABILITY_ROWS = "reliability_rows"  # a worker's rows, in its output to the controller


@pytest.fixture(scope="session")
def reliability_report() -> Report:
    return _reliability


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # noqa: ANN001 (xdist's hook: a worker is done)
    """Each worker hands its rows to the controller, which writes the one report."""
    _reliability.rows.extend(node.workeroutput.get(RELIABILITY_ROWS, []))


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        worker_output[RELIABILITY_ROWS] = _reliability.rows
    else:
        _reliability.write()


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
        "storage": storage_config(sqlalchemy_url(warehouse_url)),
        "telemetry": {"enabled": False},
    }
    with dg.instance_for_test(overrides=overrides) as test_instance:
        yield test_instance
