"""The dbt project's SQL keeps one style: sqlfluff with dbt's templater (dbt_project/.sqlfluff)
finds nothing in its models and singular tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cdp_assets.analytics.dbt_project import DBT_PROJECT_DIR, dbt_connection_env


def test_sqlfluff_finds_nothing_in_the_dbt_project(warehouse_url: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        **dbt_connection_env(warehouse_url),
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
