"""When audiences are pushed: on a membership change (sensor) and every 48 hours (schedule)."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from datetime import datetime

import dagster as dg
import psycopg

from cdp_assets.activation.audiences import audience_signature, audience_views
from cdp_assets.analytics.schedules import on_48_hour_cadence
from cdp_assets.google.assets import google_customer_match
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.meta.assets import meta_custom_audiences
from cdp_assets.partitions import tenants
from cdp_assets.tenants.registry import Tenant, list_tenants
from cdp_assets.vtex.assets import vtex_product_collections
from cdp_assets.vtex.schedules import TIMEZONE, run_priority, tenant_run_requests, with_partitions

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
    description="Every destination of one tenant: Meta, Google and VTEX collections.",
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
    signatures: dict[tuple[str, str], str] = {}
    changed: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for tenant_id, platform, audience, synced in rows:
        if audience not in views:
            continue
        key = (tenant_id, audience)
        if key not in signatures:
            signatures[key] = audience_signature(conn, tenant_id, audience)
        if signatures[key] != synced:
            changed[tenant_id][platform].add(f"{audience}={signatures[key]}")
    return changed


def change_requests(
    changed: dict[str, dict[str, set[str]]], tenant_rows: list[Tenant]
) -> list[dg.RunRequest]:
    """One run per tenant with changes, for the assets of the platforms concerned. The run
    key is a digest of the new memberships: the same change never launches twice."""
    requests = []
    for tenant in tenant_rows:
        platforms = changed.get(tenant.tenant_id)
        if not platforms:
            continue
        digest = hashlib.md5(
            "|".join(sorted(s for sigs in platforms.values() for s in sigs)).encode()
        ).hexdigest()
        requests.append(
            dg.RunRequest(
                run_key=f"{tenant.tenant_id}|{digest}",
                partition_key=tenant.tenant_id,
                asset_selection=sorted({ASSET_BY_PLATFORM[p] for p in platforms}),
                tags=run_priority(tenant),
            )
        )
    return requests


def _tenants_with_partitions(context, warehouse: WarehouseResource) -> list[Tenant]:
    with warehouse.connect() as conn:
        rows = list_tenants(conn, active_only=True)
    return with_partitions(rows, set(context.instance.get_dynamic_partitions(tenants.name)))


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
    requests = change_requests(changed, _tenants_with_partitions(context, warehouse))
    return requests or dg.SkipReason("no audience changed since its last sync")


def cadence_requests(
    tenant_rows: list[Tenant], tenants_with_destinations: set[str], moment: datetime
) -> list[dg.RunRequest]:
    if not on_48_hour_cadence(moment.date()):
        return []
    return tenant_run_requests(
        [tenant for tenant in tenant_rows if tenant.tenant_id in tenants_with_destinations], moment
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
    with warehouse.connect() as conn:
        with_destinations = {
            tenant_id
            for (tenant_id,) in conn.execute(
                "SELECT DISTINCT tenant_id FROM cdp.destinations WHERE active"
            )
        }
    requests = cadence_requests(
        _tenants_with_partitions(context, warehouse),
        with_destinations,
        context.scheduled_execution_time,
    )
    return requests or dg.SkipReason("off day of the 48-hour cadence, or no destinations")
