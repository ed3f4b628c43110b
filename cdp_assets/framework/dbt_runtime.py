"""What a forked dbt command (dbt_fork.py) changes in dbt before it starts: costs that its
output and its SQL do not need, two of every node and one of its start.

Measured on a refresh's audiences (17 models, 54 tests before one test per table, 41
tenants, nothing changed), each alone: dbt's CPU 2.9 -> 2.5 s by `render_kept_lines_only`,
Postgres' 2.4 -> 1.7 s by `reuse_node_connections`. `name_flag_sources_cheaply`: a dbt
step's first command registered its adapter 0.7 s (idle) to 1.2 s (two refreshes at once)
after it started.
"""

from __future__ import annotations

import logging
import sys
from types import FrameType
from typing import Any


def render_kept_lines_only() -> None:
    """dbt renders each event as a line for every logger (JSON, environment secrets scrubbed)
    before the logger drops those below its level: the debug events of every query (its
    connection, its SQL, its status), which neither the JSON lines dagster-dbt reads nor the
    file at info keep. A logger now drops them before rendering them; what it writes is
    unchanged."""
    from dbt_common.events import logger as dbt_logger

    write_line = dbt_logger._Logger.write_line

    def write_kept_line(self: dbt_logger._Logger, msg: Any) -> None:
        kept_by = self._python_logger
        # send_to_logger sends both levels to Logger.debug.
        dropped = msg.info.level in ("debug", "test") and not dbt_logger._is_print_event(msg)
        if dropped and (kept_by is None or not kept_by.isEnabledFor(logging.DEBUG)):
            return
        write_line(self, msg)

    dbt_logger._Logger.write_line = write_kept_line  # type: ignore[method-assign]


def reuse_node_connections() -> None:
    """dbt closes a thread's connection after each node and opens a new one for the next: a
    new server process for every model and test, whose first queries read the catalogs again.
    A thread now keeps its connection, reset as a pooler resets one between clients: the
    transaction rolled back (dbt's close does the same), then `DISCARD ALL` (settings back to
    the session's start, temporary tables and session locks dropped), so the next node finds
    the session as a new connection would. A connection that fails its reset is closed, as
    before."""
    from dbt.adapters.base.connections import BaseConnectionManager
    from dbt.adapters.contracts.connection import ConnectionState

    release = BaseConnectionManager.release

    def release_for_the_next_node(self: BaseConnectionManager) -> None:
        with self.lock:
            connection = self.get_if_exists()
        if connection is None or connection.state != ConnectionState.OPEN:
            return release(self)
        handle = connection.handle
        try:
            handle.rollback()
            connection.transaction_open = False
            handle.autocommit = True  # DISCARD ALL refuses a transaction block
            try:
                with handle.cursor() as cursor:
                    cursor.execute("DISCARD ALL")
            finally:
                handle.autocommit = False
        except Exception:  # noqa: BLE001 (a broken connection: closed, as dbt would)
            return release(self)
        return None

    BaseConnectionManager.release = release_for_the_next_node  # type: ignore[method-assign]


def name_flag_sources_cheaply() -> None:
    """dbt names the module that declared each of its adapter's behavior flags (a line of the
    warning it gives if the flag ever matters) with `inspect.stack()`, which reads the source
    of every frame and, the first time in a process, maps every loaded module (2,400 of them
    here) to its file. The frames' own module names give the same answer."""
    from dbt_common import behavior_flags

    def default_source() -> str:
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            name = frame.f_globals.get("__name__")
            if name and name != behavior_flags.__name__:
                return name
            frame = frame.f_back
        return "Unknown"

    behavior_flags.BehaviorFlagRendered._default_source = staticmethod(default_source)  # type: ignore[method-assign]
