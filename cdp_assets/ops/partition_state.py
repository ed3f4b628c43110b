"""The latest state of each tenant partition of the watched assets, kept in
`cdp.asset_partition_state` and brought up to date from Dagster's event log past a cursor per
asset key: what `cdp status` and the health verdict judge.

Grouping every materialization and planned materialization ever recorded by partition costs
more with every run; reading past the cursor costs what happened since the last read (one
range of Dagster's (asset key, event type, id) index per key), and the judgement is one
indexed query over a row per tenant partition, filtered to the tenants asked about.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import dagster as dg
import psycopg

from cdp_assets.partitions import tenant_of_partition_key

# Read again behind the cursor: an event's id is taken when it is inserted, so an event of a
# transaction still open when the log was read may become visible below ids already read.
LOOKBACK_IDS = 10_000
# Events fetched (and deserialized) at a time for their timestamps and runs.
FETCH_CHUNK = 1_000
UNKNOWN = (None, None)  # (materialized_id, planned_id) of a partition not in the table yet


@dataclass(frozen=True)
class PartitionOutcome:
    """One asset key for one tenant: its latest partition materialized, when, and the runs
    planned for that partition or a later one since their last materialization (in progress,
    or failed)."""

    partition_key: str | None = None
    last_success: datetime | None = None
    pending_run_ids: tuple[str, ...] = ()


def instance_id(instance: dg.DagsterInstance) -> str:
    """Whose storage ids the rows hold: the instance's run storage id."""
    # Every SQL run storage has it; the RunStorage interface does not declare it.
    return instance.run_storage.get_run_storage_id()  # type: ignore[attr-defined]


def _chunks(ids: Sequence[int]) -> Iterable[list[int]]:
    for start in range(0, len(ids), FETCH_CHUNK):
        yield list(ids[start : start + FETCH_CHUNK])


def _materialized_at(
    instance: dg.DagsterInstance, key: dg.AssetKey, ids: Sequence[int]
) -> dict[int, datetime]:
    found = {}
    for chunk in _chunks(ids):
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, storage_ids=chunk), limit=len(chunk)
        ).records
        found.update({r.storage_id: datetime.fromtimestamp(r.timestamp, UTC) for r in records})
    return found


def _planned_runs(
    instance: dg.DagsterInstance, key: dg.AssetKey, ids: Sequence[int]
) -> dict[int, str]:
    found = {}
    for chunk in _chunks(ids):
        records = instance.fetch_planned_materializations(
            dg.AssetRecordsFilter(asset_key=key, storage_ids=chunk), limit=len(chunk)
        ).records
        found.update({r.storage_id: r.run_id for r in records})
    return found


def _known_ids(
    conn: psycopg.Connection, owner: str, asset: str, partitions: Collection[str]
) -> dict[str, tuple[int | None, int | None]]:
    """partition -> (materialized_id, planned_id) already in the table."""
    rows = conn.execute(
        "SELECT partition_key, materialized_id, planned_id FROM cdp.asset_partition_state"
        " WHERE instance_id = %s AND asset_key = %s AND partition_key = ANY(%s)",
        (owner, asset, list(partitions)),
    ).fetchall()
    return {partition: (m, p) for partition, m, p in rows}


_UPSERT = """
INSERT INTO cdp.asset_partition_state AS s (instance_id, asset_key, partition_key, tenant_id,
    materialized_id, materialized_at, planned_id, planned_run_id)
SELECT %(instance)s, %(asset)s, p, t, m, ma, pl, r
FROM unnest(%(partitions)s::text[], %(tenants)s::text[], %(materialized)s::bigint[],
    %(materialized_at)s::timestamptz[], %(planned)s::bigint[], %(runs)s::text[])
    AS u(p, t, m, ma, pl, r)
ORDER BY p
ON CONFLICT (instance_id, asset_key, partition_key) DO UPDATE SET
    materialized_id = GREATEST(s.materialized_id, EXCLUDED.materialized_id),
    materialized_at = CASE WHEN EXCLUDED.materialized_id > coalesce(s.materialized_id, 0)
        THEN EXCLUDED.materialized_at ELSE s.materialized_at END,
    planned_id = GREATEST(s.planned_id, EXCLUDED.planned_id),
    planned_run_id = CASE WHEN EXCLUDED.planned_id > coalesce(s.planned_id, 0)
        THEN EXCLUDED.planned_run_id ELSE s.planned_run_id END
"""


def refresh(
    instance: dg.DagsterInstance, conn: psycopg.Connection, keys: Iterable[dg.AssetKey]
) -> None:
    """Read each key's events past its cursor into the table, and move the cursor: each key
    in a transaction of its own, committed for every reader."""
    owner = instance_id(instance)
    keys = sorted(set(keys), key=lambda k: k.to_user_string())
    names = [key.to_user_string() for key in keys]
    conn.commit()
    with conn.transaction():
        cursors: dict[str, int] = dict(
            conn.execute(
                "SELECT asset_key, storage_id FROM cdp.asset_partition_state_cursors"
                " WHERE instance_id = %s AND asset_key = ANY(%s)",
                (owner, names),
            ).fetchall()
        )
    for key, name in zip(keys, names, strict=True):
        after = cursors.get(name)
        with conn.transaction():
            _refresh_key(
                instance, conn, owner, key, None if after is None else after - LOOKBACK_IDS
            )


def _refresh_key(
    instance: dg.DagsterInstance,
    conn: psycopg.Connection,
    owner: str,
    key: dg.AssetKey,
    after: int | None,
) -> None:
    name = key.to_user_string()
    latest = instance.event_log_storage.get_latest_storage_id_by_partition
    materialized, planned = (
        {
            partition: storage_id
            for partition, storage_id in latest(key, event_type, after_cursor=after).items()
            if tenant_of_partition_key(partition)
        }
        for event_type in (
            dg.DagsterEventType.ASSET_MATERIALIZATION,
            dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
        )
    )
    known = _known_ids(conn, owner, name, materialized.keys() | planned.keys())
    # What the window read again and the table already holds costs nothing more.
    materialized = {p: i for p, i in materialized.items() if i != known.get(p, UNKNOWN)[0]}
    planned = {p: i for p, i in planned.items() if i != known.get(p, UNKNOWN)[1]}
    if not materialized and not planned:
        return
    at = _materialized_at(instance, key, sorted(materialized.values()))
    # Only a plan newer than the partition's latest materialization can be pending.
    pending = sorted(
        i
        for p, i in planned.items()
        if i > max(materialized.get(p, 0), known.get(p, UNKNOWN)[0] or 0)
    )
    runs = _planned_runs(instance, key, pending)
    partitions = sorted(materialized.keys() | planned.keys())
    m_ids = [materialized.get(p) for p in partitions]
    p_ids = [planned.get(p) for p in partitions]
    conn.execute(
        _UPSERT,
        {
            "instance": owner,
            "asset": name,
            "partitions": partitions,
            "tenants": [tenant_of_partition_key(p) for p in partitions],
            "materialized": m_ids,
            "materialized_at": [at.get(i) if i else None for i in m_ids],
            "planned": p_ids,
            "runs": [runs.get(i) if i else None for i in p_ids],
        },
    )
    conn.execute(
        "INSERT INTO cdp.asset_partition_state_cursors AS c (instance_id, asset_key, storage_id)"
        " VALUES (%s, %s, %s) ON CONFLICT (instance_id, asset_key)"
        " DO UPDATE SET storage_id = GREATEST(c.storage_id, EXCLUDED.storage_id)",
        (owner, name, max(i for i in (*m_ids, *p_ids) if i is not None)),
    )


_OUTCOMES = """
WITH latest AS (
    SELECT DISTINCT ON (tenant_id, asset_key) tenant_id, asset_key, partition_key, materialized_at
    FROM cdp.asset_partition_state
    WHERE instance_id = %(instance)s AND tenant_id = ANY(%(tenants)s)
      AND asset_key = ANY(%(assets)s) AND materialized_id IS NOT NULL
    ORDER BY tenant_id, asset_key, partition_key DESC
),
pending AS (
    SELECT s.tenant_id, s.asset_key, array_agg(DISTINCT s.planned_run_id) AS run_ids
    FROM cdp.asset_partition_state s
    LEFT JOIN latest l USING (tenant_id, asset_key)
    WHERE s.instance_id = %(instance)s AND s.tenant_id = ANY(%(tenants)s)
      AND s.asset_key = ANY(%(assets)s)
      AND s.planned_id > coalesce(s.materialized_id, 0) AND s.planned_run_id IS NOT NULL
      AND (l.partition_key IS NULL OR s.partition_key >= l.partition_key)
    GROUP BY 1, 2
)
SELECT tenant_id, asset_key, l.partition_key, l.materialized_at, p.run_ids
FROM latest l FULL JOIN pending p USING (tenant_id, asset_key)
"""


def partition_outcomes(
    instance: dg.DagsterInstance,
    conn: psycopg.Connection,
    keys: Collection[dg.AssetKey],
    tenant_ids: Collection[str],
) -> Mapping[tuple[str, dg.AssetKey], PartitionOutcome]:
    """(tenant, key) -> its outcome, for the keys and tenants asked about, read after a
    refresh; a pair with no row has no partition materialized or planned."""
    refresh(instance, conn, keys)
    by_name = {key.to_user_string(): key for key in keys}
    rows = conn.execute(
        _OUTCOMES,
        {"instance": instance_id(instance), "tenants": list(tenant_ids), "assets": list(by_name)},
    ).fetchall()
    found: dict[tuple[str, dg.AssetKey], PartitionOutcome] = defaultdict(PartitionOutcome)
    for tenant, name, partition, at, run_ids in rows:
        last_success = at.astimezone(UTC) if at else None
        found[(tenant, by_name[name])] = PartitionOutcome(
            partition, last_success, tuple(run_ids or ())
        )
    return found
