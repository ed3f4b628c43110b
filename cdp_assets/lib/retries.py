"""Step retry policies. Run retries (dagster.yaml) skip asset failures, so the two never
multiply: a step failure is retried here, a crashed run there."""

import dagster as dg

# For what escapes the activation code itself (a dropped database connection): platform
# failures are reported with allow_retries=False, the platforms having retried already.
# State is committed per confirmed batch, so a retried step resumes where the last stopped.
ACTIVATION_RETRY = dg.RetryPolicy(
    max_retries=2, delay=120, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)
