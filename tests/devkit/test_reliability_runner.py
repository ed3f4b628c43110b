"""`cdp reliability`: its table and exit status, with pytest replaced by a stub that writes
the report the suite's conftest would."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cdp_assets.cli import main
from cdp_devkit import reliability

PASS = {"scenario": "a", "faults": "x", "checked": 10, "lost": 0, "duplicates": 0}


def fake_pytest(
    monkeypatch: pytest.MonkeyPatch, rows: list[dict] | None, returncode: int
) -> list[list[str]]:
    """Replaces pytest's process; returns the commands it was asked to run."""
    calls = []

    def call(command: list[str], cwd: Path, env: dict[str, str]) -> int:
        calls.append(command)
        if rows is not None:
            Path(env[reliability.REPORT_ENV]).write_text(json.dumps(rows))
        return returncode

    monkeypatch.setattr(reliability.subprocess, "call", call)
    return calls


@pytest.mark.parametrize(
    ("rows", "returncode", "expected"),
    [
        ([{**PASS, "result": "pass"}], 0, 0),
        ([{**PASS, "lost": 1, "result": "FAIL"}], 0, 1),
        ([{**PASS, "duplicates": 2, "result": "FAIL"}], 0, 1),
        ([{**PASS, "result": "pass"}], 1, 1),
        (None, 0, 1),  # nothing recorded: nothing was shown to hold
    ],
)
def test_exit_status(monkeypatch, tmp_path, capsys, rows, returncode, expected):
    report = tmp_path / "reliability.json"
    report.write_text("[]")  # a stale report must not count
    fake_pytest(monkeypatch, rows, returncode)
    assert reliability.run_suite(False, report=report) == expected
    out = capsys.readouterr().out
    if rows:
        assert "| scenario" in out and "records lost" in out and "| a " in out


def test_full_runs_the_long_scenarios_too_and_passes_arguments_through(monkeypatch, tmp_path):
    monkeypatch.setenv(reliability.REPORT_ENV, str(tmp_path / "reliability.json"))
    calls = fake_pytest(monkeypatch, [{**PASS, "result": "pass"}], 0)
    result = CliRunner().invoke(main, ["reliability", "--full", "-k", "isolation"])
    assert result.exit_code == 0, result.output
    (command,) = calls
    assert command[:4] == [sys.executable, "-m", "pytest", "tests/reliability"]
    assert command[4:] == ["-m", "", "-k", "isolation"]


def test_the_table_aligns_counts_right():
    table = reliability.render_table([{**PASS, "checked": 12345, "result": "pass"}])
    header, rule, row = table.splitlines()
    assert len(header) == len(rule) == len(row)
    assert row.index("12345") + 5 == header.index("records checked") + len("records checked")
