"""A dbt command in a child forked from the step process, in place of a new `dbt` process.

A `dbt` process is a new interpreter that imports dbt before its command starts, a large share
of a small dbt step. A step process already holds dbt, imported by the server it was forked
from (the code location imports dagster-dbt, which imports dbt), so a child forked from it
starts its command at once. The child runs dbt's own command line entry point on the same
arguments, environment and folder as the `dbt` process would, writes the same JSON log lines to
a pipe and exits with the same code: dagster-dbt's invocation reads it as it reads the
subprocess.

Before the command, the child spares dbt costs its work does not need (dbt_runtime.py): the
rendering of log lines no logger keeps, a connection per node, the call stack's inspection
for each adapter option.

The child still does what every dbt command does before its work, about a second of CPU:
build the JSON schemas it validates the project against, read the saved parse. A process
forking a second command first parses the project in-process (`_warm_up`): those are then
built once, and each child inherits them.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import NoReturn

from cdp_assets.framework.dbt_parse import PARTIAL_PARSE
from cdp_assets.framework.dbt_runtime import (
    name_flag_sources_cheaply,
    render_kept_lines_only,
    reuse_node_connections,
)
from cdp_assets.lib.environ import temporary_environment

# The options of a dbt command that say which project it parses, and how.
PARSE_OPTIONS = ("--project-dir", "--profiles-dir", "--profile", "--target")
# The warm-up's parse, quiet, writing nothing and sending nothing. Without dbt's static parser:
# its Rust extension's state does not survive a fork, and a child parsing a model with it after
# the parent had waited forever. Nor tracking, whose sender would be a thread of the parent's.
WARM_UP = (
    "parse",
    "--log-level",
    "none",
    "--no-write-json",
    "--no-static-parser",
    "--no-send-anonymous-usage-stats",
)


class ForkedDbt:
    """What dagster-dbt's invocation uses of `subprocess.Popen` (the output as lines of bytes
    on `stdout`, `wait`, `send_signal`, `returncode`, `args`), for a forked dbt command."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], cwd: Path) -> None:
        self.args = list(args)
        self.returncode: int | None = None
        _warm_before_second_fork(self.args[1:], env, cwd)
        read_end, write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(read_end)
            _run_dbt_cli(self.args[1:], env, cwd, write_end)
        os.close(write_end)
        self.stdout = os.fdopen(read_end, "rb")

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            if self.returncode is None:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)


_forks = 0
_warming = threading.Lock()


def _warm_before_second_fork(args: Sequence[str], env: Mapping[str, str], cwd: Path) -> None:
    """Warm this process for its dbt commands when it forks its second (`_warm_up`). A process
    forking one (a step's) pays the same either way, so it does not."""
    global _forks
    with _warming:
        _forks += 1
        if _forks == 2:
            _warm_up(args, env, cwd)


def _warm_up(args: Sequence[str], env: Mapping[str, str], cwd: Path) -> None:
    """Parse the project of dbt command `args` in this process, quietly, from a copy of the
    saved parse it will read, in a folder of its own. What dbt builds on the way is built
    once per class, never per project: a child forked later inherits it, whatever the
    project's files then hold. A failure here is the child's to report, with its own output."""
    options = [
        argument
        for option, value in zip(args, args[1:], strict=False)
        if option in PARSE_OPTIONS
        for argument in (option, value)
    ]
    if "--project-dir" not in options:
        options += ["--project-dir", str(cwd)]
    saved = Path(env.get("DBT_TARGET_PATH", cwd / "target")) / PARTIAL_PARSE
    with tempfile.TemporaryDirectory(prefix="dbt-warm-up-") as folder:
        with suppress(OSError):
            shutil.copyfile(saved, Path(folder) / PARTIAL_PARSE)
        from dbt.adapters.factory import reset_adapters
        from dbt.cli.main import dbtRunner
        from dbt_common.events.event_manager_client import cleanup_event_logger

        try:
            with temporary_environment({**env, "DBT_TARGET_PATH": folder, "DBT_LOG_PATH": folder}):
                dbtRunner().invoke([*WARM_UP, *options])
        except Exception:  # noqa: BLE001 (see above)
            pass
        finally:
            cleanup_event_logger()
            reset_adapters()


def _run_dbt_cli(args: Sequence[str], env: Mapping[str, str], cwd: Path, output: int) -> NoReturn:
    """The child: dbt's command line on `args`, its output on `output`; never returns."""
    code = 2  # dbt's own code for an exception it did not handle
    try:
        # Objects inherited from the step (its database connections among them) are never
        # collected here: finalizing one would close the parent's connection under it.
        gc.freeze()
        # Named for what it runs (in ps, top and the benchmark's memory report), as a `dbt`
        # process's command line names it.
        with suppress(OSError):  # Linux's /proc
            Path("/proc/self/comm").write_text(" ".join(["dbt", *args[:1]])[:15])
        # The step's handlers would write to its event log through those connections, and
        # the step turns SIGINT into its own exception: dbt cancels its queries on
        # KeyboardInterrupt, as the `dbt` process does.
        for logger in [logging.root, *logging.Logger.manager.loggerDict.values()]:
            if isinstance(logger, logging.Logger):
                logger.handlers.clear()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (until _exit)
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        # dbt reads its own command line from sys.argv too (the flags of the subcommand, the
        # invocation_command it logs), which is still the step process's here.
        sys.argv = ["dbt", *args]
        render_kept_lines_only()
        reuse_node_connections()
        name_flag_sources_cheaply()
        from dbt.cli.main import cli

        cli.main(args=list(args), prog_name="dbt")  # ends in SystemExit, as the script does
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)
