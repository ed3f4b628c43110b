"""The pushes the activation sensors and schedule request (sensors.py, schedules.py): the
audiences whose membership changed, the platforms with requests awaiting a verdict, and the
runs: per destination asset, one per block of neighbouring tenants concerned, or, for changes,
one per stretch of tenants that pushes only the changed audiences."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime

import dagster as dg
import psycopg

from cdp_assets.activation.audiences import audience_signatures, audience_views
from cdp_assets.activation.destinations import resting_until
from cdp_assets.activation.google.assets import google_customer_match
from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.vtex_collections.assets import vtex_product_collections
from cdp_assets.activation.vtex_masterdata.assets import vtex_masterdata_fields
from cdp_assets.analytics.schedules import on_48_hour_cadence
from cdp_assets.tenants.registry import Tenant
from cdp_assets.tenants.runs import block_request, spanning_blocks, tenant_blocks

ASSET_BY_PLATFORM = {
    "meta": meta_custom_audiences.key,
    "google_data_manager": google_customer_match.key,
    "google_ads": google_customer_match.key,
    "vtex_collections": vtex_product_collections.key,
    "vtex_masterdata": vtex_masterdata_fields.key,
}


def changed_audiences(
    conn: psycopg.Connection, now: datetime | None = None
) -> dict[str, dict[str, set[str]]]:
    """tenant -> platform -> signatures of the audiences whose membership changed since
    their last completed sync, over active ad destinations of active tenants; but those
    whose syncs keep failing, while they rest after the last failure
    (`destinations.resting_until`).

    A signature carries the platform's id of the audience as well: once a failed push's
    audience is forgotten (`cdp destinations reset`, or a deleted audience being created
    anew), the same membership is a new request, not the failed run's spent run key."""
    now = now or datetime.now(UTC)
    rows = [
        row[:5]
        for row in conn.execute(
            """
            SELECT d.tenant_id, d.platform, a.audience, a.synced_signature,
                   a.platform_audience_id, a.failures_in_a_row, a.last_failed_at
            FROM cdp.destinations d
            JOIN cdp.destination_audiences a USING (destination_id)
            JOIN cdp.tenants t USING (tenant_id)
            WHERE d.active AND a.active AND t.active AND d.platform <> 'vtex_collections'
            """
        )
        if resting_until(row[5], row[6], now) is None
    ]
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
    changed_only: bool = False,
    held: Mapping[dg.AssetKey, set[str]] | None = None,
) -> list[dg.RunRequest]:
    """One run per destination asset and block of neighbouring tenants that have one of its
    platforms in `platforms_of` (tenant -> platforms): the platforms' pushes run side by side
    in the run queue, and a failure or re-execution of one leaves the others alone.

    `changed_only`: a block stretches from its first such tenant to its last, those between
    included, and its run pushes only the audiences that changed (one run for changes spread
    over many tenants, not one per stretch of changed neighbours). A tenant in `held`
    (asset -> tenants) ends a block, as an inactive one or one without a partition does."""
    requests = []
    for asset_key in sorted(set(ASSET_BY_PLATFORM.values())):
        free = [t for t in tenant_rows if t.tenant_id not in (held or {}).get(asset_key, set())]
        concerned = [
            tenant
            for tenant in free
            if any(
                ASSET_BY_PLATFORM[p] == asset_key for p in platforms_of.get(tenant.tenant_id, ())
            )
        ]
        blocks = (
            spanning_blocks(partition_order, free, {t.tenant_id for t in concerned})
            if changed_only
            else tenant_blocks(partition_order, concerned)
        )
        run_config = (
            {"ops": {asset_key.to_python_identifier(): {"config": {"changed_only": True}}}}
            if changed_only
            else None
        )
        requests += [
            block_request(
                block,
                f"{asset_key.to_user_string()}|{run_key(block, asset_key)}",
                [asset_key],
                run_config,
            )
            for block in blocks
        ]
    return requests


def pushes_only_changes(run: dg.DagsterRun) -> bool:
    """Whether the run pushes only the changed audiences (`change_requests`' runs)."""
    ops = run.run_config.get("ops")
    return isinstance(ops, Mapping) and any(
        (op.get("config") or {}).get("changed_only") for op in ops.values()
    )


def change_requests(
    changed: dict[str, dict[str, set[str]]],
    tenant_rows: list[Tenant],
    partition_order: Sequence[str],
    held: Mapping[dg.AssetKey, set[str]] | None = None,
) -> list[dg.RunRequest]:
    """`asset_requests` of only the changed audiences, over stretches of tenants. The run key
    is a digest of the stretch's new memberships on the asset's platforms: the same change
    never launches twice."""

    def digest(block: list[Tenant], asset_key: dg.AssetKey) -> str:
        return hashlib.md5(
            "|".join(
                sorted(
                    f"{tenant.tenant_id}/{signature}"
                    for tenant in block
                    for platform, signatures in changed.get(tenant.tenant_id, {}).items()
                    if ASSET_BY_PLATFORM[platform] == asset_key
                    for signature in signatures
                )
            ).encode()
        ).hexdigest()

    return asset_requests(
        changed, tenant_rows, partition_order, digest, changed_only=True, held=held
    )


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


def awaiting_verdicts(conn: psycopg.Connection) -> dict[str, set[str]]:
    """tenant -> platforms with requests still awaiting the platform's verdict, over active
    destinations of active tenants; but audiences resting after failed syncs
    (`destinations.resting_until`), which a poll would not push."""
    now = datetime.now(UTC)
    platforms_of: dict[str, set[str]] = defaultdict(set)
    for tenant_id, platform, failures, last_failed_at in conn.execute(
        """
        SELECT DISTINCT d.tenant_id, d.platform, a.failures_in_a_row, a.last_failed_at
        FROM cdp.destination_requests r
        JOIN cdp.destinations d USING (destination_id)
        JOIN cdp.destination_audiences a USING (destination_id, audience)
        JOIN cdp.tenants t USING (tenant_id)
        WHERE r.status = 'pending' AND d.active AND t.active
        """
    ):
        if resting_until(failures, last_failed_at, now) is None:
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
