"""`cdp reliability`: run the reliability suite (tests/reliability) and print its table.

The suite's conftest writes one row per scenario to a JSON report; the command runs pytest in
a child process of this interpreter (so the suite gets its own fresh database and sandboxes)
and renders that report. A scenario passes only with nothing lost and nothing duplicated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SUITE = "tests/reliability"
REPORT_ENV = "CDP_RELIABILITY_REPORT"  # read by tests/support/reliability_report.py
DEFAULT_REPORT = PROJECT_ROOT / "bench" / "results" / "reliability.json"

COLUMNS = (
    ("scenario", "scenario"),
    ("faults", "faults injected"),
    ("checked", "records checked"),
    ("lost", "records lost"),
    ("duplicates", "duplicates"),
    ("result", "result"),
)


def pytest_command(full: bool, extra_args: Sequence[str] = ()) -> list[str]:
    """pytest over the suite; `full` also runs the long randomized scenarios, which the
    project's default options (`-m 'not long'`) leave out."""
    command = [sys.executable, "-m", "pytest", SUITE]
    if full:
        command += ["-m", ""]
    return command + list(extra_args)


def load_rows(report: Path) -> list[dict[str, Any]]:
    return json.loads(report.read_text()) if report.exists() else []


def row_failed(row: dict[str, Any]) -> bool:
    return row["result"] != "pass" or row["lost"] != 0 or row["duplicates"] != 0


def render_table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table (readable in a terminal, pasted as is into docs/reliability.md)."""
    cells = [[str(row[key]) for key, _ in COLUMNS] for row in rows]
    headers = [title for _, title in COLUMNS]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(headers)]
    # Text columns left-aligned, counts right-aligned.
    right = [key in ("checked", "lost", "duplicates") for key, _ in COLUMNS]

    def line(values: Sequence[str]) -> str:
        padded = (
            v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)
        )
        return "| " + " | ".join(padded) + " |"

    rule = "".join(
        f"|{'-' * (w + 1)}:" if r else f"|{'-' * (w + 2)}"
        for w, r in zip(widths, right, strict=True)
    )
    return "\n".join([line(headers), rule + "|", *(line(c) for c in cells)])


def run_suite(full: bool, extra_args: Sequence[str] = (), report: Path | None = None) -> int:
    """Run the suite, print its table; the exit status: 0 only when pytest passed and every
    scenario recorded a row with nothing lost or duplicated. The report goes to `report`,
    else $CDP_RELIABILITY_REPORT, else bench/results/reliability.json."""
    report = report or Path(os.environ.get(REPORT_ENV) or DEFAULT_REPORT)
    # A report left by an earlier run must not pass for this one's.
    report.unlink(missing_ok=True)
    env = {**os.environ, REPORT_ENV: str(report)}
    returncode = subprocess.call(pytest_command(full, extra_args), cwd=PROJECT_ROOT, env=env)
    rows = load_rows(report)
    print()
    if not rows:
        print(f"no scenario recorded a result in {report}")
        return returncode or 1
    print(render_table(rows))
    failed = [row["scenario"] for row in rows if row_failed(row)]
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    if returncode:
        print(f"\npytest exited with status {returncode}")
    return 1 if failed and not returncode else returncode
