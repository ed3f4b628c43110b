"""The reliability suite's report: each scenario of tests/reliability records what it
injected and checked; `cdp reliability` prints the table from the JSON written at the end.

Long randomized scenarios carry the `long` marker: CI runs the fixed-seed subset
(`-m "not long"`), `cdp reliability --full` runs everything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# Set by `cdp reliability` (cdp_devkit.reliability.REPORT_ENV). A plain test run writes no
# report: the published one (bench/results/reliability.json) is `cdp reliability`'s.
REPORT_PATH = os.environ.get("CDP_RELIABILITY_REPORT")


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

    def write(self) -> None:
        """The JSON report, when `cdp reliability` asked for one and some scenario ran."""
        if REPORT_PATH and self.rows:
            report = Path(REPORT_PATH)
            report.parent.mkdir(parents=True, exist_ok=True)
            report.write_text(json.dumps(self.rows, indent=2))
