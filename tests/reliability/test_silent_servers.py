"""Servers that take a call and never finish answering it: a Postgres port that accepts and
stays silent, a VTEX that drips its answers a byte at a time. Every call fails within its
deadline with an error saying what did not answer, and nothing waits on it for longer: not a
session of the platform, not Dagster's storage, not a `cdp` command, not an ingestion run.
(Meta and Google calls that never answer: tests/activation/test_activation_meta.py and
tests/activation/test_activation_google.py.)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
import sqlalchemy
from support import register, sync, vtex_for

from cdp_assets.lib.database import CONNECT_TIMEOUT_ENV, connect, sqlalchemy_url
from cdp_devkit.sandbox import SandboxProcess, StoreSpec

CONNECT_TIMEOUT = 2  # libpq's least
STORE = StoreSpec("dripping", seed=81, customers=30, orders=30, products=12)
DEADLINE = 1.5  # seconds a VTEX request may take in all


@contextmanager
def silent_postgres() -> Iterator[str]:
    """A port whose connections the kernel accepts and nothing ever answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"postgresql://cdp:never-sent@127.0.0.1:{listener.getsockname()[1]}/cdp"


def timed(call: Callable[[], object]) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        call()
    except Exception as error:  # what failed is checked by the caller
        return time.monotonic() - started, error
    return time.monotonic() - started, None


@pytest.mark.timeout(180)
def test_every_call_to_a_silent_server_fails_within_its_deadline(
    conn, instance, monkeypatch, reliability_report
):
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, str(CONNECT_TIMEOUT))
    seconds: dict[str, float] = {}
    errors: dict[str, str] = {}
    with silent_postgres() as url:
        seconds["a platform session"], error = timed(lambda: connect(url))
        assert isinstance(error, psycopg.OperationalError)
        errors["a platform session"] = str(error)
        engine = sqlalchemy.create_engine(sqlalchemy_url(url), poolclass=sqlalchemy.NullPool)
        seconds["Dagster's storage"], error = timed(lambda: engine.connect().close())
        assert isinstance(error, sqlalchemy.exc.OperationalError)
        errors["Dagster's storage"] = str(error.orig)
        command = [str(Path(sys.executable).parent / "cdp"), "tenants", "list"]
        environ = {**os.environ, "DATABASE_URL": url, CONNECT_TIMEOUT_ENV: str(CONNECT_TIMEOUT)}
        started = time.monotonic()
        done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=60)
        seconds["cdp tenants list"] = time.monotonic() - started
        assert done.returncode != 0
        errors["cdp tenants list"] = done.stderr + done.stdout
    for what in ("a platform session", "Dagster's storage"):
        assert "timeout" in errors[what].lower(), errors[what]
    assert "never-sent" not in errors["cdp tenants list"]

    with SandboxProcess([STORE]) as sandbox:
        register(conn, "silent_vtex", STORE.account)
        sandbox.set_faults({"drip": {"get_product": 0.2}})
        vtex = vtex_for(
            sandbox, deadline_seconds=DEADLINE, max_retries=1, step_retry_base_seconds=0.1
        )
        started = time.monotonic()
        (result,) = sync(
            instance,
            sandbox,
            "silent_vtex",
            vtex=vtex,
            entities=("products",),
            raise_on_error=False,
        ).values()
        seconds["an ingestion run (3 step retries)"] = time.monotonic() - started
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    error = failure.step_failure_data.error.to_string()  # the cause: the client's error
    assert f"no complete answer within {DEADLINE:g} s" in error, error

    # libpq's connect_timeout is whole seconds, checked once a second.
    bounds = {
        "a platform session": CONNECT_TIMEOUT + 2,
        "Dagster's storage": CONNECT_TIMEOUT + 2,
        "cdp tenants list": 30,
        "an ingestion run (3 step retries)": 60,
    }
    late = {what: s for what, s in seconds.items() if s > bounds[what]}
    reliability_report.record(
        "silent servers: a Postgres that never answers, a VTEX that drips",
        faults=", ".join(f"{what} failed in {s:.1f} s" for what, s in seconds.items()),
        checked=len(seconds),
        lost=len(late),  # a call that outlived its bound
        duplicates=0,
        passed=not late,
    )
    assert not late, late
