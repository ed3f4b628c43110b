"""What a forked dbt command changes in dbt before it starts (framework/dbt_runtime.py): the
lines it renders, the connections its nodes use; neither what it writes nor what a node's
session holds."""

from __future__ import annotations

import io
import json
import textwrap
import uuid
from pathlib import Path

import psycopg
import pytest

from cdp_assets.analytics.dbt_files import DBT_EXECUTABLE, DBT_PROJECT_DIR
from cdp_assets.framework.dbt_fork import ForkedDbt
from cdp_assets.framework.dbt_runtime import name_flag_sources_cheaply, render_kept_lines_only


def test_a_forked_dbt_renders_only_the_lines_its_loggers_keep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """dbt renders each event for every logger before the logger drops what is below its
    level; the child drops a debug event (the SQL of each query) before rendering it, unless a
    logger keeps it, and writes the same lines."""
    from dbt.adapters.events.types import SQLQuery
    from dbt_common.events import logger as dbt_logger
    from dbt_common.events.base_types import EventLevel, msg_from_base_event
    from dbt_common.events.types import Note

    # dbt's own write_line comes back after the test, as the child exits with its own.
    monkeypatch.setattr(dbt_logger._Logger, "write_line", dbt_logger._Logger.write_line)
    render_kept_lines_only()
    rendered: list[tuple[str, str]] = []

    class CountingLogger(dbt_logger._JsonLogger):
        def create_line(self, msg) -> str:  # noqa: ANN001
            rendered.append((self.name.split("-")[0], msg.info.name))
            return super().create_line(msg)

    outputs = {level: io.StringIO() for level in ("info", "debug")}
    loggers = [
        CountingLogger(
            dbt_logger.LoggerConfig(
                name=f"{level}-{uuid.uuid4().hex}",
                line_format=dbt_logger.LineFormat.Json,
                level=EventLevel(level),
                output_stream=output,
            )
        )
        for level, output in outputs.items()
    ]
    for event in (SQLQuery(conn_name="model.cdp.x", sql="select 1", node_info={}), Note(msg="hi")):
        msg = msg_from_base_event(event)
        for logger in loggers:
            logger.write_line(msg)

    assert rendered == [("debug", "SQLQuery"), ("info", "Note"), ("debug", "Note")]
    written = {level: output.getvalue().splitlines() for level, output in outputs.items()}
    assert [json.loads(line)["info"]["name"] for line in written["info"]] == ["Note"]
    assert [json.loads(line)["info"]["name"] for line in written["debug"]] == ["SQLQuery", "Note"]


def test_a_forked_dbts_nodes_share_a_connection_each_as_new(
    dbt_env: dict[str, str], warehouse_url: str, tmp_path: Path
) -> None:
    """One thread's nodes use one server session, and each finds it as a new connection would:
    the first node's temporary table, setting and session lock are gone for the second."""
    schema = f"runtime_{uuid.uuid4().hex[:8]}"
    project = tmp_path / "project"
    (project / "models").mkdir(parents=True)
    (project / "dbt_project.yml").write_text(
        "name: runtime\nversion: '1.0'\nprofile: cdp\nconfig-version: 2\n"
        "models:\n  runtime:\n    +materialized: table\n"
    )
    session = (
        "select pg_backend_pid() as pid, current_setting('work_mem') as work_mem,"
        " to_regclass('pg_temp.left_behind') is not null as sees_temp_table,"
        " (select count(*) from pg_locks where locktype = 'advisory'"
        " and pid = pg_backend_pid()) as session_locks"
    )
    (project / "models" / "first.sql").write_text(
        textwrap.dedent(
            """
            {{ config(pre_hook=[
                "create temporary table left_behind (x int)",
                "set work_mem = '1234kB'",
                "select pg_advisory_lock(4242)",
            ]) }}
            """
        )
        + session
    )
    (project / "models" / "second.sql").write_text("-- depends_on: {{ ref('first') }}\n" + session)
    command = [
        DBT_EXECUTABLE,
        "run",
        "--target",
        "prod",
        "--threads",
        "1",
        "--log-format",
        "json",
        "--profiles-dir",
        str(DBT_PROJECT_DIR),
        "--project-dir",
        str(project),
    ]
    (project / "macros").mkdir()
    (project / "macros" / "schema.sql").write_text(
        "{% macro generate_schema_name(custom, node) %}" + schema + "{% endmacro %}"
    )
    forked = ForkedDbt(command, dbt_env, project)
    with forked.stdout:
        output = forked.stdout.read().decode()
    assert forked.wait() == 0, output[-3000:]
    with psycopg.connect(warehouse_url) as conn:
        rows = {
            model: conn.execute(
                f"SELECT pid, work_mem, sees_temp_table, session_locks FROM {schema}.{model}"
            ).fetchone()
            for model in ("first", "second")
        }
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
    first, second = rows["first"], rows["second"]
    assert second[0] == first[0]  # the same server session
    assert first[1:] == ("1234kB", True, 1)
    assert second[1] != "1234kB"
    assert second[2:] == (False, 0)


def test_a_forked_dbt_names_a_flags_source_without_inspecting_the_stack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The module declaring an adapter's behavior flag, as dbt names it, from the frames
    alone: `inspect.stack()` (every frame's source read) is never called."""
    import inspect

    from dbt_common import behavior_flags

    flag = {"name": "some_flag", "default": False, "description": "Some behavior."}
    declared = behavior_flags.Behavior([flag], {}).some_flag  # type: ignore[list-item]
    name_by_dbt = declared._behavior_change_event.flag_source
    monkeypatch.setattr(
        behavior_flags.BehaviorFlagRendered,
        "_default_source",
        behavior_flags.BehaviorFlagRendered.__dict__["_default_source"],  # the staticmethod
    )
    name_flag_sources_cheaply()

    def no_stack(context: int = 1) -> list:
        raise AssertionError("inspect.stack() was called")

    monkeypatch.setattr(inspect, "stack", no_stack)
    declared = behavior_flags.Behavior([flag], {}).some_flag  # type: ignore[list-item]
    assert declared._behavior_change_event.flag_source == name_by_dbt == __name__
