"""What the tests of forked dbt commands share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdp_assets.analytics.dbt_files import dbt_connection_env


@pytest.fixture
def dbt_env(warehouse_url: str, tmp_path: Path) -> dict[str, str]:
    """A dbt command's environment on the test database, its output in `tmp_path/target`."""
    return {
        **os.environ,
        **dbt_connection_env(warehouse_url),
        "DO_NOT_TRACK": "1",
        "DBT_TARGET_PATH": str(tmp_path / "target"),
        "DBT_LOG_PATH": str(tmp_path / "target"),
    }
