"""The reliability suite's report: each scenario records what it injected and checked.

`cdp reliability` runs this folder and prints the table from the JSON written here.
Long randomized scenarios carry the `long` marker: CI runs the fixed-seed subset
(`-m "not long"`), `cdp reliability --full` runs everything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPORT = Path(os.environ.get("CDP_RELIABILITY_REPORT", "bench/results/reliability.json"))


class Report:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def record(
        self,
        scenario: str,
        *,
        faults: str,
        checked: int,
        lost: int,
        duplicates: int,
        passed: bool,
    ) -> None:
        """One table row: `lost` and `duplicates` must be 0 for the scenario to pass."""
        self.rows.append(
            {
                "scenario": scenario,
                "faults": faults,
                "checked": checked,
                "lost": lost,
                "duplicates": duplicates,
                "result": "pass" if passed and lost == 0 and duplicates == 0 else "FAIL",
            }
        )


_report = Report()
ROWS_KEY = "reliability_rows"


@pytest.fixture(scope="session")
def reliability_report() -> Report:
    return _report


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # noqa: ANN001 (xdist's hook: a worker is done)
    """On xdist, each worker hands its rows to the controller, which writes the one report."""
    _report.rows.extend(node.workeroutput.get(ROWS_KEY, []))


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        worker_output[ROWS_KEY] = _report.rows
    elif _report.rows:
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        REPORT.write_text(json.dumps(_report.rows, indent=2))
