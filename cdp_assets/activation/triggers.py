"""When audiences are pushed: on a membership change (sensor) and every 48 hours (schedule)."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime

import dagster as dg
import psycopg

from cdp_assets.activation.audiences import audience_signatures, audience_views
from cdp_assets.analytics.schedules import on_48_hour_cadence
from cdp_assets.google.assets import google_customer_match
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.meta.assets import meta_custom_audiences
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, tenants
from cdp_assets.tenants.registry import Tenant, list_tenants
from cdp_assets.vtex.assets import vtex_product_collections
from cdp_assets.vtex.schedules import TIMEZONE, run_priority, with_partitions

ASSET_BY_PLATFORM = {
    "meta": meta_custom_audiences.key,
    "google_data_manager": google_customer_match.key,
    "google_ads": google_customer_match.key,
    "vtex_collections": vtex_product_collections.key,
}

activation_push = dg.define_asset_job(
    "activation_push",
    selection=[meta_custom_audiences, google_customer_match, vtex_product_collections],
    partitions_def=tenants,
    description="Every destination of the run's tenants (one, or a range): Meta, Google and VTEX"
    " collections.",
)


def changed_audiences(conn: psycopg.Connection) -> dict[str, dict[str, set[str]]]:
    """tenant -> platform -> signatures of the audiences whose membership changed since
    their last completed sync, over active ad destinations of active tenants."""
    rows = conn.execute(
        """
        SELECT d.tenant_id, d.platform, a.audience, a.synced_signature
        FROM cdp.destinations d
        JOIN cdp.destination_audiences a USING (destination_id)
        JOIN cdp.tenants t USING (tenant_id)
        WHERE d.active AND a.active AND t.active AND d.platform <> 'vtex_collections'
        """
    ).fetchall()
    views = audience_views(conn)
    tenants_of: dict[str, set[str]] = defaultdict(set)
    for tenant_id, _, audience, _ in rows:
        tenants_of[audience].add(tenant_id)
    signatures = {
        audience: audience_signatures(conn, audience, tenant_ids)
        for audience, tenant_ids in tenants_of.items()
        if audience in views
    }
    changed: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for tenant_id, platform, audience, synced in rows:
        if audience not in signatures:
            continue
        signature = signatures[audience][tenant_id]
        if signature != synced:
            changed[tenant_id][platform].add(f"{audience}={signature}")
    return changed


def tenant_blocks(partition_order: Sequence[str], tenant_rows: list[Tenant]) -> list[list[Tenant]]:
    """`tenant_rows` as blocks of neighbours in the tenants' partition order: one block is one
    range of partitions, which one run covers (the activation assets run a range as one step
    each). A tenant that is not in `tenant_rows` ends a block, so no run reaches it."""
    by_id = {tenant.tenant_id: tenant for tenant in tenant_rows}
    blocks: list[list[Tenant]] = []
    current: list[Tenant] = []
    for tenant_id in partition_order:
        if tenant_id in by_id:
            current.append(by_id[tenant_id])
        elif current:
            blocks.append(current)
            current = []
    return blocks + ([current] if current else [])


def block_request(
    block: list[Tenant], run_key: str, asset_selection: list[dg.AssetKey] | None = None
) -> dg.RunRequest:
    """One run over a block of tenants, with the priority of the most urgent of them."""
    first, last = block[0].tenant_id, block[-1].tenant_id
    scope = {} if first == last else {RANGE_START_TAG: first, RANGE_END_TAG: last}
    return dg.RunRequest(
        run_key=f"{first}..{last}|{run_key}",
        partition_key=first if first == last else None,
        asset_selection=asset_selection,
        tags={**scope, **run_priority(min(block, key=lambda tenant: tenant.priority))},
    )


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


def _tenants_with_partitions(
    context, warehouse: WarehouseResource
) -> tuple[list[Tenant], list[str]]:
    """Active tenants that have a partition, and the partitions in their order."""
    with warehouse.connect() as conn:
        rows = list_tenants(conn, active_only=True)
    order = context.instance.get_dynamic_partitions(tenants.name)
    return with_partitions(rows, set(order)), order


@dg.sensor(
    job=activation_push,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
)
def audience_changes_sensor(
    context: dg.SensorEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    """Pushes an audience whose membership changed, within one tick (one minute)."""
    with warehouse.connect() as conn:
        changed = changed_audiences(conn)
    requests = change_requests(changed, *_tenants_with_partitions(context, warehouse))
    return requests or dg.SkipReason("no audience changed since its last sync")


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
)
def activation_every_48_hours(
    context: dg.ScheduleEvaluationContext, warehouse: WarehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    """Every active destination of every active tenant, every 48 hours at 10:00."""
    platforms_of: dict[str, set[str]] = defaultdict(set)
    with warehouse.connect() as conn:
        for tenant_id, platform in conn.execute(
            "SELECT DISTINCT tenant_id, platform FROM cdp.destinations WHERE active"
        ):
            platforms_of[tenant_id].add(platform)
    requests = cadence_requests(
        *_tenants_with_partitions(context, warehouse),
        platforms_of,
        context.scheduled_execution_time,
    )
    return requests or dg.SkipReason("off day of the 48-hour cadence, or no destinations")
