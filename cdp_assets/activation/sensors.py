"""When audiences are pushed besides the 48-hour schedule: on a membership change, and while
a platform has yet to give its verdict on what it acknowledged (each sync first reads the
verdicts of its audience's pending requests)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import dagster as dg

from cdp_assets.activation.jobs import activation_push
from cdp_assets.activation.push_requests import (
    ASSET_BY_PLATFORM,
    VERDICT_POLL_MINUTES,
    awaiting_verdicts,
    change_requests,
    changed_audiences,
    pushes_only_changes,
    verdict_requests,
)
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.tenants.runs import (
    run_tenants_of,
    runs_in_flight,
    tenants_with_partitions,
)


@dg.sensor(
    job=activation_push,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every 30 seconds, pushes the audiences whose membership changed since their last"
    " sync to Meta and Google: one run per destination asset over the tenants with a change on"
    " its platforms, pushing only what changed. None while a push of changes to that asset is"
    " queued or running under 15 minutes (the next one covers everything changed meanwhile),"
    " and none for a tenant that the 48-hour push or a verdict poll is pushing. The same"
    " change never launches twice, and an audience whose last syncs failed rests before it is"
    " tried again (15 minutes after a failure, doubling with each further one up to 12 hours).",
)
def audience_changes_sensor(
    context: dg.SensorEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    with warehouse.connect() as conn:
        changed = changed_audiences(conn)
    tenant_rows, order = tenants_with_partitions(context, warehouse)
    requests = change_requests(
        changed, tenant_rows, order, pushes_in_flight(context.instance, order)
    )
    return requests or dg.SkipReason(
        "no audience changed since its last sync, or a push to its destination asset is queued"
        " or running"
    )


def pushes_in_flight(
    instance: dg.DagsterInstance, partition_order: Sequence[str]
) -> dict[dg.AssetKey, set[str]]:
    """Destination asset -> the tenants no push of changes may cover now.

    - Every tenant while a push of changes to the asset is queued or running: a burst of
      audience changes is then one push per asset, requested once that push ends, over every
      tenant changed meanwhile. Splitting around the tenants in flight instead made a dozen
      runs of each refresh of every tenant, and filled the run queue.
    - Else the tenants of its other pushes in flight (the 48-hour push, a verdict poll, a push
      of changes running for over CHANGES_PUSH_HOLDS_ALL): a queued one reads the members when
      it starts (the change is in it), a running one is followed by a push of changes once it
      ends; no two runs push one tenant at once."""
    held: dict[dg.AssetKey, set[str]] = defaultdict(set)
    now = time.time()
    for record in runs_in_flight(instance, activation_push.name):
        run = record.dagster_run
        tenants = (
            set(partition_order)
            if pushes_only_changes(run) and not _running_long(record, now)
            else run_tenants_of(run, partition_order)
        )
        for asset_key in run.asset_selection or set(ASSET_BY_PLATFORM.values()):
            held[asset_key] |= tenants
    return held


# A push of changes takes seconds to a minute at 41 tenants. One running longer holds only its
# own tenants: stuck (a platform call hung, its process gone unnoticed), it would otherwise
# hold every tenant's changes until run monitoring ends it (the push's bound: 2 hours).
CHANGES_PUSH_HOLDS_ALL = timedelta(minutes=15)


def _running_long(record: dg.RunRecord, now: float) -> bool:
    """Whether the run started over CHANGES_PUSH_HOLDS_ALL before `now` (epoch seconds)."""
    started = record.start_time
    return started is not None and now - started > CHANGES_PUSH_HOLDS_ALL.total_seconds()


@dg.sensor(
    job=activation_push,
    minimum_interval_seconds=300,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="While a platform has yet to confirm what it acknowledged (Data Manager"
    " requests, Google Ads jobs), pushes the tenants concerned every"
    f" {VERDICT_POLL_MINUTES} minutes: each sync first reads the verdicts, confirms or re-sends"
    " the members, and stores the audience's signature once nothing is pending.",
)
def pending_verdicts_sensor(
    context: dg.SensorEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    with warehouse.connect() as conn:
        platforms_of = awaiting_verdicts(conn)
    if not platforms_of:
        return dg.SkipReason("no request awaits a platform's verdict")
    requests = verdict_requests(
        platforms_of, *tenants_with_partitions(context, warehouse), datetime.now(UTC)
    )
    return requests or dg.SkipReason("no active tenant with a partition awaits a verdict")
