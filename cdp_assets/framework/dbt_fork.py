"""A dbt command in a child forked from the step process, in place of a new `dbt` process.

A `dbt` process is a new interpreter that imports dbt before its command starts, a large share
of a small dbt step. A step process already holds dbt, imported by the server it was forked
from (the code location imports dagster-dbt, which imports dbt), so a child forked from it
starts its command at once. The child runs dbt's own command line entry point on the same
arguments, environment and folder as the `dbt` process would, writes the same JSON log lines to
a pipe and exits with the same code: dagster-dbt's invocation reads it as it reads the
subprocess.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import NoReturn


class ForkedDbt:
    """What dagster-dbt's invocation uses of `subprocess.Popen` (the output as lines of bytes
    on `stdout`, `wait`, `send_signal`, `returncode`, `args`), for a forked dbt command."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], cwd: Path) -> None:
        self.args = list(args)
        self.returncode: int | None = None
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
