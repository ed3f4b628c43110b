"""The embedded server: processes starting at once in a fresh home share one server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg

START_AND_PRINT_URL = (
    "from cdp_assets.lib.database import database_url; print(database_url(), flush=True)"
)


def test_processes_starting_together_share_one_embedded_server(tmp_path: Path):
    home = tmp_path / "h"  # short: the server's socket lives under it
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"CDP_HOME": str(home)}
    starts = [
        subprocess.Popen(
            [sys.executable, "-c", START_AND_PRINT_URL + "; import sys; sys.stdin.read()"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        urls = {process.stdout.readline().strip() for process in starts}
        errors = [p.stderr.read() for p in starts if p.poll() not in (None, 0)]
        assert errors == []
        assert len(urls) == 1 and "" not in urls
        with psycopg.connect(urls.pop()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        for process in starts:
            process.communicate("", timeout=60)  # end of stdin: each process exits
    assert [process.returncode for process in starts] == [0, 0, 0]
