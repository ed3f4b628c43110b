"""dbt commands in a child forked from the step process (framework/dbt_fork.py): the child
answers as the `dbt` process would, stops as it does, and leaves its parent's connections
alone."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from cdp_assets.analytics.dbt_files import DBT_EXECUTABLE, DBT_PROJECT_DIR
from cdp_assets.framework.dbt_fork import ForkedDbt


def dbt_command(*args: str) -> list[str]:
    return [DBT_EXECUTABLE, *args, "--profiles-dir", str(DBT_PROJECT_DIR), "--log-format", "json"]


def events(output: bytes) -> list[dict]:
    """dbt's JSON log lines (the rest is Python's warnings, on stderr), and no traceback."""
    assert b"Traceback" not in output, output.decode()[-3000:]
    return [json.loads(line) for line in output.decode().splitlines() if line.startswith("{")]


def read_meanwhile(forked: ForkedDbt) -> threading.Thread:
    """Its output read as it comes (as dagster-dbt does): a full pipe would stop the child."""
    reader = threading.Thread(target=forked.stdout.read, daemon=True)
    reader.start()
    return reader


@pytest.mark.parametrize(
    ("query", "succeeds"),
    [("select 41 + 1 as answer", True), ("select * from no_such_relation", False)],
)
def test_forked_dbt_answers_as_the_dbt_process(
    dbt_env: dict[str, str], query: str, succeeds: bool
) -> None:
    log_folder = Path(dbt_env["DBT_LOG_PATH"])
    command = dbt_command("show", "--inline", query, "--output", "json")
    spawned = subprocess.run(command, env=dbt_env, cwd=DBT_PROJECT_DIR, capture_output=True)
    forked = ForkedDbt(command, dbt_env, DBT_PROJECT_DIR)
    with forked.stdout:
        output = forked.stdout.read()
    assert forked.wait() == spawned.returncode
    assert (forked.returncode == 0) == succeeds
    forked_events = events(output)
    nodes = {"ShowNode", "SQLRunnerException", "CompiledNode"}
    assert [e["info"]["name"] for e in forked_events if e["info"]["name"] in nodes] == [
        e["info"]["name"] for e in events(spawned.stdout) if e["info"]["name"] in nodes
    ]
    # The events come from the child, not from this process, which dbt takes for the one
    # invoked as `dbt ...` (its log names the command, not this process's arguments).
    assert {e["info"]["pid"] for e in forked_events} == {forked.pid}
    logged = re.findall(r"'invocation_command': '([^']*)'", (log_folder / "dbt.log").read_text())
    assert logged[-1] == " ".join(["dbt", *command[1:]])
    shown = [e["data"] for e in forked_events if e["info"]["name"] == "ShowNode"]
    if succeeds:
        assert json.loads(shown[0]["preview"]) == [{"answer": 42}]
    else:
        assert not shown
        assert any("no_such_relation" in e["info"]["msg"] for e in forked_events)


def test_an_interrupted_forked_dbt_cancels_its_query(
    dbt_env: dict[str, str], warehouse_url: str
) -> None:
    # Autocommit: a transaction would see one snapshot of pg_stat_activity throughout.
    conn = psycopg.connect(warehouse_url, autocommit=True)
    marker = f"sleeping_{uuid.uuid4().hex[:8]}"
    query = f"select pg_sleep(120) as {marker}"
    forked = ForkedDbt(dbt_command("show", "--inline", query), dbt_env, DBT_PROJECT_DIR)
    reader = read_meanwhile(forked)
    running = (
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()"
    )
    deadline = time.monotonic() + 60
    while conn.execute(running, (f"%{marker}%",)).fetchone()[0] == 0:
        assert time.monotonic() < deadline, "the query never started"
        assert forked.poll() is None, "dbt ended before its query started"
        time.sleep(0.2)
    # Named as a `dbt` process's command line would name it (ps, the benchmark's report).
    assert Path(f"/proc/{forked.pid}/comm").read_text().strip() == "dbt show"
    started = time.monotonic()
    forked.send_signal(signal.SIGINT)
    code = forked.wait(timeout=30)
    reader.join()
    assert code != 0
    assert time.monotonic() - started < 30  # not the two minutes of the query
    assert conn.execute(running, (f"%{marker}%",)).fetchone()[0] == 0
    conn.close()


def test_the_parents_connection_outlives_a_forked_dbt(
    dbt_env: dict[str, str], warehouse_url: str
) -> None:
    with psycopg.connect(warehouse_url, autocommit=True) as parent:
        before = parent.execute("SELECT pg_backend_pid()").fetchone()[0]
        forked = ForkedDbt(dbt_command("show", "--inline", "select 1"), dbt_env, DBT_PROJECT_DIR)
        read_meanwhile(forked).join()
        assert forked.wait() == 0
        # The child inherited the connection's socket; had it closed the connection on its
        # way out, the server would have ended this session.
        assert parent.execute("SELECT pg_backend_pid()").fetchone()[0] == before


# A process of its own: whether it has forked before is the module's state. Each command in a
# folder of its own, none holding a saved parse: every parse is whole, the warm-up's too, and
# the third command's (its vars differ) uses dbt's static parser in the child after it.
THREE_FORKS = """
import json, os, sys, tempfile
from dbt.adapters.factory import FACTORY
from dbt.contracts.project import Project
from dbt_common.events.event_manager_client import get_event_manager
from cdp_assets.analytics.dbt_files import DBT_PROJECT_DIR
from cdp_assets.framework.dbt_fork import ForkedDbt

command, env = json.loads(sys.argv[1])
environment = dict(os.environ)
schemas = Project.json_schema.__func__.cache_info
report = {}
for fork, extra in (("first", []), ("second", []), ("third", ["--vars", "{as_of: 2026-01-01}"])):
    folder = tempfile.mkdtemp()
    forked = ForkedDbt(
        [*command, *extra], {**env, "DBT_TARGET_PATH": folder, "DBT_LOG_PATH": folder},
        DBT_PROJECT_DIR,
    )
    forked.stdout.read()
    report[fork] = {"code": forked.wait(), "schemas": schemas().currsize}
report["environment_kept"] = dict(os.environ) == environment
report["loggers"] = len(get_event_manager().loggers)
report["adapters"] = len(FACTORY.adapters)
print(json.dumps(report))
"""


def test_a_process_warms_dbt_before_its_second_fork_and_keeps_nothing_of_it(
    dbt_env: dict[str, str], tmp_path: Path
) -> None:
    command = dbt_command("parse", "--target", "prod")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    # A session of its own, so that a child stuck on what the parent's parse left (see
    # WARM_UP), which never ends, is stopped with it.
    process = subprocess.Popen(
        [sys.executable, "-c", THREE_FORKS, json.dumps([command, dbt_env])],
        env={**os.environ, "TMPDIR": str(temporary)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        output, errors = process.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, errors[-3000:]
    report = json.loads(output.splitlines()[-1])
    # One fork: the process built nothing of dbt's itself (its child did).
    assert report["first"] == {"code": 0, "schemas": 0}
    # Before the second, it parsed the project: the schemas its children validate with are
    # built, and they inherit them; a later child parses whole as before.
    assert report["second"]["code"] == report["third"]["code"] == 0
    assert report["second"]["schemas"] > 0
    # The parse left the process as it was: its environment, no log handler, no adapter, no
    # folder of its own.
    assert report["environment_kept"] and report["loggers"] == report["adapters"] == 0
    assert not [path for path in temporary.iterdir() if path.name.startswith("dbt-warm-up-")]
