"""When audiences are pushed besides the 48-hour schedule: on a membership change, and while
a platform has yet to give its verdict on what it acknowledged (each sync first reads the
verdicts of its audience's pending requests)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import dagster as dg

from cdp_assets.activation.jobs import activation_push
from cdp_assets.activation.push_requests import (
    ASSET_BY_PLATFORM,
    VERDICT_POLL_MINUTES,
    awaiting_verdicts,
    change_requests,
    changed_audiences,
    verdict_requests,
)
from cdp_assets.analytics.jobs import tenants_in_flight
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.tenants.runs import tenants_with_partitions


@dg.sensor(
    job=activation_push,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every 30 seconds, pushes the audiences whose membership changed since their last"
    " sync: one run per destination asset (Meta, Google, VTEX collections and Master Data)"
    " over the tenants with a change on its platforms, pushing only what changed; none while"
    " a push to that asset is queued or running. The same change never launches twice.",
)
def audience_changes_sensor(
    context: dg.SensorEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    with warehouse.connect() as conn:
        changed = changed_audiences(conn)
    tenant_rows, order = tenants_with_partitions(context, warehouse)
    requests = change_requests(
        without_pushes_in_flight(changed, context.instance, order), tenant_rows, order
    )
    return requests or dg.SkipReason(
        "no audience changed since its last sync, or a push to its destination asset is queued"
        " or running"
    )


def without_pushes_in_flight(
    changed: dict[str, dict[str, set[str]]],
    instance: dg.DagsterInstance,
    partition_order: Sequence[str],
) -> dict[str, dict[str, set[str]]]:
    """`changed` but the platforms of the destination assets with a push queued or running,
    whatever its tenants. A burst of audience changes is then one push per asset, over every
    tenant it changed, requested as the push before it ends: not a run per stretch of
    tenants between those whose push is in flight (which, with each refresh changing every
    tenant a little, made a dozen runs per refresh and filled the run queue)."""
    busy = {
        asset_key
        for asset_key in set(ASSET_BY_PLATFORM.values())
        if any(tenants_in_flight(instance, [activation_push.name], partition_order, asset_key))
    }
    return {
        tenant_id: {
            platform: signatures
            for platform, signatures in platforms.items()
            if ASSET_BY_PLATFORM[platform] not in busy
        }
        for tenant_id, platforms in changed.items()
    }


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
