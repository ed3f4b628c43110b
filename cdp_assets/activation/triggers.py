"""When audiences are pushed: on a membership change (sensor), every 48 hours (schedule), and
while a platform has yet to give its verdict on what it acknowledged (sensor): each sync
first reads the verdicts of its audience's pending requests."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime

import dagster as dg
import psycopg

from cdp_assets.activation.audiences import audience_signatures, audience_views
from cdp_assets.activation.google.assets import google_customer_match
from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.vtex_collections.assets import vtex_product_collections
from cdp_assets.activation.vtex_masterdata.assets import vtex_masterdata_fields
from cdp_assets.analytics.jobs import tenants_in_flight
from cdp_assets.analytics.schedules import FORTY_EIGHT_HOUR_CADENCE, on_48_hour_cadence
from cdp_assets.lib.run_bounds import run_bound
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import TIMEZONE, tenants
from cdp_assets.tenants.registry import Tenant
from cdp_assets.tenants.runs import block_request, tenant_blocks, tenants_with_partitions

ASSET_BY_PLATFORM = {
    "meta": meta_custom_audiences.key,
    "google_data_manager": google_customer_match.key,
    "google_ads": google_customer_match.key,
    "vtex_collections": vtex_product_collections.key,
    "vtex_masterdata": vtex_masterdata_fields.key,
}

activation_push = dg.define_asset_job(
    "activation_push",
    selection=[
        meta_custom_audiences,
        google_customer_match,
        vtex_product_collections,
        vtex_masterdata_fields,
    ],
    partitions_def=tenants,
    description="Every destination of the run's tenants (one, or a range): Meta, Google, VTEX"
    " collections and the fields written to VTEX Master Data.",
    tags=run_bound("activation_push"),
)


def changed_audiences(conn: psycopg.Connection) -> dict[str, dict[str, set[str]]]:
    """tenant -> platform -> signatures of the audiences whose membership changed since
    their last completed sync, over active ad destinations of active tenants.

    A signature carries the platform's id of the audience as well: once a failed push's
    audience is forgotten (`cdp destinations reset`, or a deleted audience being created
    anew), the same membership is a new request, not the failed run's spent run key."""
    rows = conn.execute(
        """
        SELECT d.tenant_id, d.platform, a.audience, a.synced_signature, a.platform_audience_id
        FROM cdp.destinations d
        JOIN cdp.destination_audiences a USING (destination_id)
        JOIN cdp.tenants t USING (tenant_id)
        WHERE d.active AND a.active AND t.active AND d.platform <> 'vtex_collections'
        """
    ).fetchall()
    views = audience_views(conn)
    tenants_of: dict[str, set[str]] = defaultdict(set)
    for tenant_id, _, audience, _, _ in rows:
        tenants_of[audience].add(tenant_id)
    signatures = {
        audience: audience_signatures(conn, audience, tenant_ids)
        for audience, tenant_ids in tenants_of.items()
        if audience in views
    }
    changed: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for tenant_id, platform, audience, synced, platform_audience_id in rows:
        if audience not in signatures:
            continue
        signature = signatures[audience][tenant_id]
        if signature != synced:
            changed[tenant_id][platform].add(
                f"{audience}={signature}@{platform_audience_id or 'new'}"
            )
    return changed


def asset_requests(
    platforms_of: Mapping[str, Iterable[str]],
    tenant_rows: list[Tenant],
    partition_order: Sequence[str],
    run_key: Callable[[list[Tenant], dg.AssetKey], str],
) -> list[dg.RunRequest]:
    """One run per destination asset and block of neighbouring tenants that have one of its
    platforms in `platforms_of` (tenant -> platforms): the platforms' pushes run side by side
    in the run queue, and a failure or re-execution of one leaves the others alone."""
    requests = []
    for asset_key in sorted(set(ASSET_BY_PLATFORM.values())):
        concerned = [
            tenant
            for tenant in tenant_rows
            if any(
                ASSET_BY_PLATFORM[p] == asset_key for p in platforms_of.get(tenant.tenant_id, ())
            )
        ]
        requests += [
            block_request(
                block, f"{asset_key.to_user_string()}|{run_key(block, asset_key)}", [asset_key]
            )
            for block in tenant_blocks(partition_order, concerned)
        ]
    return requests


def change_requests(
    changed: dict[str, dict[str, set[str]]],
    tenant_rows: list[Tenant],
    partition_order: Sequence[str],
) -> list[dg.RunRequest]:
    """A run per asset and block of neighbouring tenants with changes on its platforms. The
    run key is a digest of the block's new memberships there: the same change never launches
    twice."""

    def digest(block: list[Tenant], asset_key: dg.AssetKey) -> str:
        return hashlib.md5(
            "|".join(
                sorted(
                    f"{tenant.tenant_id}/{signature}"
                    for tenant in block
                    for platform, signatures in changed[tenant.tenant_id].items()
                    if ASSET_BY_PLATFORM[platform] == asset_key
                    for signature in signatures
                )
            ).encode()
        ).hexdigest()

    return asset_requests(changed, tenant_rows, partition_order, digest)


@dg.sensor(
    job=activation_push,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every minute, pushes the audiences whose membership changed since their last"
    " sync: one run per destination asset (Meta, Google, VTEX collections and Master Data) and"
    " block of neighbouring tenants with a change on its platforms, none for a tenant whose"
    " push to that asset is queued or running. The same change never launches twice.",
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
        "no audience changed since its last sync, or its push is queued or running"
    )


def without_pushes_in_flight(
    changed: dict[str, dict[str, set[str]]],
    instance: dg.DagsterInstance,
    partition_order: Sequence[str],
) -> dict[str, dict[str, set[str]]]:
    """`changed` but the platforms of a tenant whose destination asset has a push queued
    (it reads the members when it starts: the change is in it) or running (the change is
    requested again once it ends, if its signature still differs): a burst of audience
    changes is one push per tenant and asset, not one per change."""
    busy = {
        asset_key: set().union(
            *tenants_in_flight(instance, [activation_push.name], partition_order, asset_key)
        )
        for asset_key in set(ASSET_BY_PLATFORM.values())
    }
    return {
        tenant_id: {
            platform: signatures
            for platform, signatures in platforms.items()
            if tenant_id not in busy[ASSET_BY_PLATFORM[platform]]
        }
        for tenant_id, platforms in changed.items()
    }


def cadence_requests(
    tenant_rows: list[Tenant],
    partition_order: Sequence[str],
    platforms_of: Mapping[str, Iterable[str]],
    moment: datetime,
) -> list[dg.RunRequest]:
    """Every 48 hours, a run per asset and block of neighbouring tenants with active
    destinations on its platforms (`platforms_of`: tenant -> platforms)."""
    if not on_48_hour_cadence(moment.date()):
        return []
    return asset_requests(
        platforms_of, tenant_rows, partition_order, lambda block, asset_key: f"{moment:%Y%m%d}"
    )


@dg.schedule(
    job=activation_push,
    cron_schedule="0 10 * * *",
    execution_timezone=TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every active destination of every active tenant pushed every 48 hours, at"
    " 10:00 (Buenos Aires): one run per destination asset and block of neighbouring tenants."
    f" {FORTY_EIGHT_HOUR_CADENCE}",
)
def activation_every_48_hours(
    context: dg.ScheduleEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    platforms_of: dict[str, set[str]] = defaultdict(set)
    with warehouse.connect() as conn:
        for tenant_id, platform in conn.execute(
            "SELECT DISTINCT tenant_id, platform FROM cdp.destinations WHERE active"
        ):
            platforms_of[tenant_id].add(platform)
    requests = cadence_requests(
        *tenants_with_partitions(context, warehouse),
        platforms_of,
        context.scheduled_execution_time,
    )
    return requests or dg.SkipReason("off day of the 48-hour cadence, or no destinations")


def awaiting_verdicts(conn: psycopg.Connection) -> dict[str, set[str]]:
    """tenant -> platforms with requests still awaiting the platform's verdict, over active
    destinations of active tenants."""
    platforms_of: dict[str, set[str]] = defaultdict(set)
    for tenant_id, platform in conn.execute(
        """
        SELECT DISTINCT d.tenant_id, d.platform
        FROM cdp.destination_requests r
        JOIN cdp.destinations d USING (destination_id)
        JOIN cdp.tenants t USING (tenant_id)
        WHERE r.status = 'pending' AND d.active AND t.active
        """
    ):
        platforms_of[tenant_id].add(platform)
    return platforms_of


# Google asks to wait about 30 minutes before reading a request's status, then to poll with
# backoff (https://developers.google.com/data-manager/api/devguides/diagnostics); a Google Ads
# job can take hours. One run per tenant block and half hour while requests are pending.
VERDICT_POLL_MINUTES = 30


def verdict_requests(
    platforms_of: Mapping[str, Iterable[str]],
    tenant_rows: list[Tenant],
    partition_order: Sequence[str],
    moment: datetime,
) -> list[dg.RunRequest]:
    """A run per asset and block of neighbouring tenants with pending requests on its
    platforms, once per VERDICT_POLL_MINUTES."""
    slot = int(moment.timestamp()) // (VERDICT_POLL_MINUTES * 60)
    return asset_requests(
        platforms_of, tenant_rows, partition_order, lambda block, asset_key: f"verdicts-{slot}"
    )


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
