"""What the dbt assets record on their outputs beside dbt's events, read from the warehouse:
segment sizes, the churn holdout's repurchase rates per band, and how far behind their
source's latest orders the audiences were."""

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import dagster as dg
import psycopg

SEGMENT_SIZES_SQL = """
SELECT tenant_id, segment, count(*) FROM marts.rfm_segments WHERE tenant_id = ANY(%s)
 GROUP BY 1, 2 ORDER BY 1, 3 DESC
"""


def segment_metadata(conn: psycopg.Connection, tenant_ids: Sequence[str]) -> dict:
    """Segment sizes as a table, and a number per segment (plotted over time) when the run
    is one tenant's: a run over several records the same metadata on each of them."""
    sizes = conn.execute(SEGMENT_SIZES_SQL, (list(tenant_ids),)).fetchall()
    table = "| tenant | segment | customers |\n|---|---|---|\n" + "\n".join(
        f"| {t} | {s} | {n} |" for t, s, n in sizes
    )
    metadata: dict = {"segments": dg.MetadataValue.md(table)}
    if len(tenant_ids) == 1:
        metadata.update({f"segment_size/{segment}": count for _, segment, count in sizes})
        metadata["segment_chart"] = dg.MetadataValue.md(bar_chart(sizes))
    return metadata


def bar_chart(sizes: Sequence[tuple[str, str, int]], width: int = 30) -> str:
    """Segment sizes as a text bar chart: readable in the UI's Markdown view."""
    largest = max((n for _, _, n in sizes), default=0)
    if not largest:
        return "no segments"
    label = max(len(s) for _, s, _ in sizes)
    rows = [f"{s:<{label}} {'█' * max(1, round(width * n / largest))} {n}" for _, s, n in sizes]
    return "```\n" + "\n".join(rows) + "\n```"


HOLDOUT_RATES_SQL = """
SELECT tenant_id, churn_band, count(*), avg(repurchased::integer), min(calibration_date)
  FROM marts.churn_holdout WHERE tenant_id = ANY(%s)
 GROUP BY 1, 2 ORDER BY 1, array_position(ARRAY['low', 'medium', 'high', 'lost'], churn_band)
"""


def holdout_metadata(conn: psycopg.Connection, tenant_ids: Sequence[str]) -> dict:
    """The churn holdout: per band, the customers and the share who bought again after the
    calibration date; as numbers too when the run is one tenant's."""
    rates = conn.execute(HOLDOUT_RATES_SQL, (list(tenant_ids),)).fetchall()
    table = "| tenant | band as of | band | customers | bought again |\n|---|---|---|---:|---:|\n"
    table += "\n".join(f"| {t} | {d} | {b} | {n} | {float(r):.1%} |" for t, b, n, r, d in rates)
    metadata: dict = {"holdout_repurchase": dg.MetadataValue.md(table)}
    if len(tenant_ids) == 1:
        for _, band, customers, rate, _ in rates:
            metadata[f"holdout_repurchase_rate/{band}"] = float(rate)
            metadata[f"holdout_customers/{band}"] = customers
    return metadata


# Per tenant: when the newest order landed in the source, and how long the oldest order
# landed since the tenant's previous audience refresh waited for this one.
SOURCE_LANDINGS_SQL = """
SELECT previous.tenant_id, max(orders.synced_at),
       min(orders.synced_at) FILTER (WHERE orders.synced_at > previous.refreshed_at)
  FROM unnest(%s::text[], %s::timestamptz[]) AS previous (tenant_id, refreshed_at)
  LEFT JOIN raw_vtex.orders AS orders USING (tenant_id)
 GROUP BY previous.tenant_id
"""


def previous_refreshes(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, tenant_ids: Sequence[str]
) -> dict[str, datetime | None]:
    """When each tenant's audiences were last refreshed before this run (None: never), in two
    queries whatever the number of tenants (one per tenant cost a refresh of 400 tenants
    seconds before its first model)."""
    latest = instance.get_latest_storage_id_by_partition(
        asset_key, dg.DagsterEventType.ASSET_MATERIALIZATION, set(tenant_ids)
    )
    refreshed: dict[str, datetime | None] = dict.fromkeys(tenant_ids)
    if latest:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, storage_ids=list(latest.values())),
            limit=len(latest),
        ).records
        for record in records:
            if record.partition_key in refreshed:
                refreshed[record.partition_key] = datetime.fromtimestamp(record.timestamp, UTC)
    return refreshed


def source_landings(
    conn: psycopg.Connection, previous: Mapping[str, datetime | None]
) -> dict[str, tuple[datetime | None, datetime | None]]:
    """tenant -> (newest order landing, oldest landing since `previous[tenant]`), as this
    refresh reads its source."""
    tenant_ids = sorted(previous)
    epoch = datetime.fromtimestamp(0, UTC)
    since = [previous[tenant_id] or epoch for tenant_id in tenant_ids]
    rows = conn.execute(SOURCE_LANDINGS_SQL, (tenant_ids, since)).fetchall()
    return {tenant_id: (newest, oldest_waiting) for tenant_id, newest, oldest_waiting in rows}


def freshness_metadata(
    landings: Mapping[str, tuple[datetime | None, datetime | None]], refreshed_at: datetime
) -> dict:
    """The audiences' age against their source, per tenant: as numbers (plotted over time on
    the tenant's partition) when the run is one tenant's, as a table otherwise."""
    table = "| tenant | newest order landed | oldest change waited (s) |\n|---|---|---:|\n"
    table += "\n".join(
        f"| {t} | {newest:%Y-%m-%d %H:%M:%S} | {_waited(oldest, refreshed_at)} |"
        if newest
        else f"| {t} | no orders | |"
        for t, (newest, oldest) in sorted(landings.items())
    )
    metadata: dict = {"source_freshness": dg.MetadataValue.md(table)}
    if len(landings) == 1:
        ((newest, oldest),) = landings.values()
        if newest is not None:
            metadata["source_landed_at"] = dg.MetadataValue.timestamp(newest)
        if oldest is not None:
            metadata["seconds_behind_source"] = _waited(oldest, refreshed_at)
    return metadata


def _waited(landed: datetime | None, refreshed_at: datetime) -> float | str:
    return "" if landed is None else round((refreshed_at - landed).total_seconds(), 1)
