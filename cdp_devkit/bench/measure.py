"""What every stage reports: wall seconds, records per second, peak memory, database size.

This process's peak RSS during a stage is its own (it drives the runs): the kernel's
high-water mark (VmHWM) is reset at the start of each stage by writing 5 to
/proc/self/clear_refs. Runs execute in run worker processes, and dbt in their children, whose
peaks are sampled apart; each run worker also reports its own when its run ends.
"""

from __future__ import annotations

import os
import re
import resource
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_mb(name: str) -> float | None:
    try:
        match = re.search(rf"^{name}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) / 1024 if match else None


def _reset_peak() -> bool:
    """Reset this process's RSS high-water mark (Linux >= 4.0); False where unsupported."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def rss_mb() -> float:
    current = _status_mb("VmRSS")
    return current if current is not None else peak_rss_mb()


def peak_rss_mb() -> float:
    """VmHWM since the last reset; without /proc, the lifetime peak from getrusage."""
    peak = _status_mb("VmHWM")
    if peak is not None:
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class ChildPeak:
    """The largest VmHWM of this process's descendants (the run workers and the dbt processes
    they start), sampled while a stage runs; each one's high-water mark is reset first, so a
    process that outlives a stage (the run workers' server, the sandboxes) does not carry its
    peak of an earlier stage into it. getrusage(RUSAGE_CHILDREN) cannot serve: a child forked
    from a process counts that process's pages until it execs. The sandboxes (VTEX's, and
    Meta's and Google's) stand in for remote services: their peak is kept apart, in
    `sandbox_peak_mb`. So is the run workers' server's (`server_peak_mb`): it runs nothing, and
    its idle RSS counts shared libraries that its workers map without touching."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.peak_mb = 0.0
        self.peak_process = ""  # which process reached peak_mb (process_label)
        self.sandbox_peak_mb = 0.0
        self.server_peak_mb = 0.0
        self._own_command = Path("/proc/self/cmdline").read_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="bench-child-rss", daemon=True)

    def __enter__(self) -> ChildPeak:
        for pid in _descendants(os.getpid()):
            with suppress(OSError):  # exited meanwhile, or no clear_refs
                Path(f"/proc/{pid}/clear_refs").write_text("5")
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()  # what grew since the last tick

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        own_pid = os.getpid()
        for pid, parent in _descendants(own_pid).items():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:  # it exited meanwhile
                continue
            # A child caught between fork and exec still maps this process's pages
            # (seen: a 659 MB "child" during activation, which runs no dbt).
            match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
            if not match or command == self._own_command:
                continue
            peak = int(match.group(1)) / 1024
            if b"cdp_devkit.sandbox" in command:
                self.sandbox_peak_mb = max(self.sandbox_peak_mb, peak)
            elif parent == own_pid and b"multiprocessing" in command:
                # The run workers' server (and its resource tracker): the workers are its
                # children, with the same command line.
                self.server_peak_mb = max(self.server_peak_mb, peak)
            elif peak > self.peak_mb:
                name = re.search(r"^Name:\s+(.*)$", status, re.MULTILINE)
                label = process_label(command, name.group(1) if name else "")
                self.peak_mb, self.peak_process = peak, label


def process_label(command: bytes, name: str = "") -> str:
    """What a descendant is, from its NUL-separated command line and its name: a dbt command
    (a dbt forked from its run worker has the worker's command line, and its name), or a run
    worker (a Python interpreter started by multiprocessing), or the program's name."""
    if name.startswith("dbt "):
        return name
    argv = [part.decode(errors="replace") for part in command.split(b"\0") if part]
    if not argv:
        return "?"
    # dbt runs as its own script (`dbt build ...`) or under the interpreter (`python dbt ...`).
    for position, part in enumerate(argv[:2]):
        if Path(part).name == "dbt":
            return " ".join(["dbt", *argv[position + 1 : position + 2]])
    if any("multiprocessing" in part for part in argv):
        return "run worker"
    return Path(argv[0]).name


def _descendants(root: int) -> dict[int, int]:
    """Every descendant of `root`, with its parent."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields follow the last ')'.
        parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found |= dict.fromkeys(children, parent)
        frontier += children
    return found


def database_size_mb(url: str) -> float:
    with psycopg.connect(url) as conn:
        (size,) = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return size / 2**20


@dataclass
class StageResult:
    """One stage's measurements; `details` holds what is specific to the stage."""

    name: str
    wall_seconds: float = 0.0
    records: int = 0
    records_label: str = "records"
    rss_start_mb: float = 0.0
    peak_rss_mb: float = 0.0
    peak_rss_exact: bool = True  # False: the lifetime peak, the stage's could not be isolated
    child_peak_rss_mb: float = 0.0
    child_peak_process: str = ""
    sandbox_peak_rss_mb: float = 0.0
    worker_server_peak_rss_mb: float = 0.0
    database_size_mb: float = 0.0
    largest_run_peak: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def records_per_second(self) -> float:
        return self.records / self.wall_seconds if self.wall_seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "wall_seconds": round(self.wall_seconds, 3),
            "records": self.records,
            "records_label": self.records_label,
            "records_per_second": round(self.records_per_second, 1),
            "rss_start_mb": round(self.rss_start_mb, 1),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "peak_rss_exact": self.peak_rss_exact,
            "child_peak_rss_mb": round(self.child_peak_rss_mb, 1),
            "child_peak_process": self.child_peak_process,
            "sandbox_peak_rss_mb": round(self.sandbox_peak_rss_mb, 1),
            "worker_server_peak_rss_mb": round(self.worker_server_peak_rss_mb, 1),
            "database_size_mb": round(self.database_size_mb, 1),
            **({"largest_run_peak": self.largest_run_peak} if self.largest_run_peak else {}),
            **self.details,
        }


@contextmanager
def stage(name: str, database_url: str) -> Iterator[StageResult]:
    """Measure the body as one stage; the caller fills in records and details."""
    result = StageResult(name)
    result.peak_rss_exact = _reset_peak()
    result.rss_start_mb = rss_mb()
    started = time.perf_counter()
    with ChildPeak() as children:
        yield result
    result.wall_seconds = time.perf_counter() - started
    result.peak_rss_mb = peak_rss_mb()
    result.child_peak_rss_mb = children.peak_mb
    result.child_peak_process = children.peak_process
    result.sandbox_peak_rss_mb = children.sandbox_peak_mb
    result.worker_server_peak_rss_mb = children.server_peak_mb
    result.database_size_mb = database_size_mb(database_url)


class Stopwatch:
    """Wall seconds of named parts of a stage, summed over repeated entries."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def rounded(self) -> dict[str, float]:
        return {name: round(value, 3) for name, value in self.seconds.items()}


def consistency_check(name: str, expected: Any, actual: Any) -> dict[str, Any]:
    """A stage's check that two counts agree, as the report lists it."""
    return {"check": name, "expected": expected, "actual": actual, "ok": expected == actual}
