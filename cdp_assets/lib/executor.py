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
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import dagster as dg
from dagster_celery import celery_executor

EXECUTOR_ENV = "CDP_EXECUTOR"
BROKER_ENV = "CDP_CELERY_BROKER"
BACKEND_ENV = "CDP_CELERY_BACKEND"
MULTIPROCESS, CELERY = "multiprocess", "celery"


class ExecutorConfigError(ValueError):
    """The environment asks for an executor that cannot be built."""


# Dagster's default starts each step with `spawn`: a new interpreter that imports the code
# location again, seconds of CPU per step (dbt, Google Ads' generated types, scipy), more than
# many steps' own work. A forkserver imports it once per run (with what creating the instance
# imports, lib/preload.py) and forks every step from it. Run config can still choose `spawn`,
# other options, or `in_process`.
PRELOADED = "cdp_assets.lib.preload"
multiprocess_forkserver_executor = dg.ExecutorDefinition(
    name=dg.multi_or_in_process_executor.name,
    config_schema=dg.Field(
        dg.multi_or_in_process_executor.config_schema.as_field().config_type,
        default_value={
            "multiprocess": {"start_method": {"forkserver": {"preload_modules": [PRELOADED]}}}
        },
    ),
    requirements=dg.multi_or_in_process_executor.get_requirements,
    executor_creation_fn=dg.multi_or_in_process_executor.executor_creation_fn,
    description="Dagster's default executor, forking steps from a preloaded forkserver.",
)


def executor_from_env(environ: Mapping[str, str] | None = None) -> dg.ExecutorDefinition:
    """The executor `CDP_EXECUTOR` selects."""
    environ = os.environ if environ is None else environ
    choice = (environ.get(EXECUTOR_ENV) or MULTIPROCESS).strip().lower()
    if choice == MULTIPROCESS:
        return multiprocess_forkserver_executor
    if choice != CELERY:
        raise ExecutorConfigError(
            f"{EXECUTOR_ENV}={choice!r}: expected {MULTIPROCESS!r} (the default) or {CELERY!r}"
        )
    missing = [name for name in (BROKER_ENV, BACKEND_ENV) if not environ.get(name)]
    if missing:
        raise ExecutorConfigError(f"{EXECUTOR_ENV}=celery needs {' and '.join(missing)} set")
    # The backend is explicit: dagster-celery's default, rpc://, is Celery's RabbitMQ-only
    # result channel. The workers read the same two variables (deploy/celery.yaml).
    return celery_executor.configured(
        {"broker": {"env": BROKER_ENV}, "backend": {"env": BACKEND_ENV}}, name=CELERY
    )
