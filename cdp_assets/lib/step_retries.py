"""Step retries. Run retries (dagster.yaml) skip asset failures, so the two never multiply:
a step failure is retried here, a crashed run there."""

import random
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg


@contextmanager
def retry_transient(
    context: dg.AssetExecutionContext,
    transient: tuple[type[BaseException], ...],
    *,
    max_retries: int = 3,
    base_seconds: float = 30.0,
) -> Iterator[None]:
    """Retry the step on transient errors only, with exponential backoff and jitter.

    A `RetryPolicy` would also retry what can never succeed (refused credentials, a
    deactivated tenant); those fail at once instead.
    """
    try:
        yield
    except transient as error:
        wait = base_seconds * 2**context.retry_number * random.uniform(0.5, 1.5)
        raise dg.RetryRequested(max_retries=max_retries, seconds_to_wait=wait) from error


# For what escapes the activation code itself (a dropped database connection): platform
# failures are reported with allow_retries=False, the platforms having retried already.
# State is committed per confirmed batch, so a retried step resumes where the last stopped.
ACTIVATION_RETRY = dg.RetryPolicy(
    max_retries=2, delay=120, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)
