"""Which executor runs the steps of every job: Dagster's default, or Celery workers.

Chosen by the environment of the code location (and so of the run workers it launches):

- `CDP_EXECUTOR` unset or `multiprocess`: Dagster's default executor (a process per step on
  the run worker's machine; `execution: config: in_process: {}` still works), with its
  processes forked from a server that has imported the code location once (`forkserver`).
- `CDP_EXECUTOR=celery`: each step is a Celery task on the broker `CDP_CELERY_BROKER`
  (e.g. `redis://redis:6379/0`), its result on `CDP_CELERY_BACKEND` (e.g.
  `redis://redis:6379/1`), run by `dagster-celery worker start -A dagster_celery.app
  -y deploy/celery.yaml` on any number of hosts.

The executor config names the variables, not their values: a broker password never reaches
the run config the UI shows, nor the event log.

Cancelling a run interrupts its run worker (SIGINT from the code server, SIGTERM when Kubernetes
deletes the run's pod); Dagster's multiprocess executor passes the request on to each step
process, which raises an interrupt in the step's code. A step whose code does not return from a
blocking call then (or ignores the interrupt) would outlive the run: the executor here kills the
step processes still alive `CDP_STEP_STOP_GRACE_SECONDS` after the request.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import dagster as dg
from dagster._core.executor.base import Executor
from dagster._core.executor.multiprocess import MultiprocessExecutor
from dagster_celery import celery_executor

from cdp_assets.lib import settings

EXECUTOR_ENV = "CDP_EXECUTOR"
BROKER_ENV = "CDP_CELERY_BROKER"
BACKEND_ENV = "CDP_CELERY_BACKEND"
MULTIPROCESS, CELERY = "multiprocess", "celery"
STEP_STOP_GRACE_ENV = "CDP_STEP_STOP_GRACE_SECONDS"


class ExecutorConfigError(ValueError):
    """The environment asks for an executor that cannot be built."""


# Dagster's default starts each step with `spawn`: a new interpreter that imports the code
# location again, seconds of CPU per step (dbt, Google Ads' generated types, scipy), more than
# many steps' own work. A forkserver imports it once per run (with what creating the instance
# imports, framework/preload.py) and forks every step from it. Run config can still choose `spawn`,
# other options, or `in_process`.
PRELOADED = "cdp_assets.framework.preload"


def _kill(pids: Iterable[int]) -> None:
    for pid in list(pids):
        with contextlib.suppress(ProcessLookupError):  # it ended by itself
            os.kill(pid, signal.SIGKILL)


class StepStoppingExecutor(Executor):
    """Dagster's multiprocess executor, killing the step processes that are still alive
    `grace` seconds after the run was asked to stop."""

    def __init__(self, inner: MultiprocessExecutor, grace: float) -> None:
        self.inner, self.grace = inner, grace

    @property
    def retries(self) -> Any:
        return self.inner.retries

    @property
    def step_dependency_config(self) -> Any:
        return self.inner.step_dependency_config

    def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[dg.DagsterEvent]:
        running: dict[str | None, int] = {}  # step key -> its process
        reaper: threading.Timer | None = None
        try:
            for event in self.inner.execute(plan_context, execution_plan):
                if event.event_type == dg.DagsterEventType.STEP_WORKER_STARTED and event.pid:
                    running[event.step_key] = event.pid
                elif event.event_type in _STEP_ENDED:
                    running.pop(event.step_key, None)
                elif reaper is None and _stop_requested(event):
                    # The mapping stays live: a step starting meanwhile is killed too.
                    reaper = threading.Timer(self.grace, _kill, [running.values()])
                    reaper.daemon = True
                    reaper.start()
                yield event
        finally:
            if reaper is not None:
                reaper.cancel()


_STEP_ENDED = frozenset(
    {
        dg.DagsterEventType.STEP_SUCCESS,
        dg.DagsterEventType.STEP_FAILURE,
        dg.DagsterEventType.STEP_UP_FOR_RETRY,
        dg.DagsterEventType.STEP_SKIPPED,
    }
)


def _stop_requested(event: dg.DagsterEvent) -> bool:
    """The engine event the multiprocess executor logs when it forwards a termination."""
    data = event.event_specific_data
    return event.is_engine_event and "steps_interrupted" in (getattr(data, "metadata", None) or {})


def _multiprocess_or_in_process(init_context: dg.InitExecutorContext) -> Executor:
    create = dg.multi_or_in_process_executor.executor_creation_fn
    assert create is not None  # set by the `@executor` decorator
    executor = create(init_context)
    if not isinstance(executor, MultiprocessExecutor):
        return executor
    return StepStoppingExecutor(executor, settings.positive_number(STEP_STOP_GRACE_ENV))


multiprocess_forkserver_executor = dg.ExecutorDefinition(
    name=dg.multi_or_in_process_executor.name,
    config_schema=dg.Field(
        dg.multi_or_in_process_executor.config_schema.as_field().config_type,
        default_value={
            "multiprocess": {"start_method": {"forkserver": {"preload_modules": [PRELOADED]}}}
        },
    ),
    requirements=dg.multi_or_in_process_executor.get_requirements,
    executor_creation_fn=_multiprocess_or_in_process,
    description="Dagster's default executor, forking steps from a preloaded forkserver; a step"
    " still running a while after its run was asked to stop is killed.",
)


def executor_from_env(environ: Mapping[str, str] | None = None) -> dg.ExecutorDefinition:
    """The executor `CDP_EXECUTOR` selects."""
    choice = settings.required(EXECUTOR_ENV, environ).lower()
    if choice == MULTIPROCESS:
        return multiprocess_forkserver_executor
    if choice != CELERY:
        raise ExecutorConfigError(
            f"{EXECUTOR_ENV}={choice!r}: expected {MULTIPROCESS!r} (the default) or {CELERY!r}"
        )
    missing = [name for name in (BROKER_ENV, BACKEND_ENV) if not settings.value(name, environ)]
    if missing:
        raise ExecutorConfigError(f"{EXECUTOR_ENV}=celery needs {' and '.join(missing)} set")
    # The backend is explicit: dagster-celery's default, rpc://, is Celery's RabbitMQ-only
    # result channel. The workers read the same two variables (deploy/celery.yaml).
    return celery_executor.configured(
        {"broker": {"env": BROKER_ENV}, "backend": {"env": BACKEND_ENV}}, name=CELERY
    )
