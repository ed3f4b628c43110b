"""Audiences refreshed one tenant at a time: a tenant's refresh makes its rows of every
audience the query's, writing only those that changed, and touches no other tenant's; a
reader sees the tenant's old members until the new ones commit, never none; each refresh says
how far behind its source it was."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import dagster as dg
import psycopg
import pytest
from support import register, store_from_history_start, sync

from cdp_assets.analytics.assets import dbt_audiences
from cdp_assets.analytics.dbt_metadata import previous_refreshes
from cdp_assets.analytics.dbt_project import dbt_resource
from cdp_assets.analytics.jobs import CHANGES_JOB
from cdp_assets.definitions import defs
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG
from cdp_devkit.sandbox import SandboxProcess

STORES = {
    "per_a": store_from_history_start("pera", seed=81, customers=300, orders=1500, products=20),
    "per_b": store_from_history_start("perb", seed=82, customers=300, orders=1500, products=20),
}
CHAMPIONS = "audience_rfm_champions"


@pytest.fixture(scope="module")
def built(warehouse_url, instance):
    """Both stores synced, analysed and their audiences built in one run."""
    with SandboxProcess(list(STORES.values())) as sandbox, psycopg.connect(warehouse_url) as conn:
        for tenant_id, spec in STORES.items():
            register(conn, tenant_id, spec.account)
            sync(instance, sandbox, tenant_id)
    result = defs.resolve_job_def(CHANGES_JOB).execute_in_process(
        instance=instance, tags={RANGE_START_TAG: "per_a", RANGE_END_TAG: "per_b"}
    )
    assert result.success
    return warehouse_url


def refresh(instance: dg.DagsterInstance, tenant_id: str, *audiences: str):
    selection = [dg.AssetKey(audience) for audience in audiences] or None
    return dg.materialize(
        [dbt_audiences],
        partition_key=tenant_id,
        instance=instance,
        resources={"dbt": dbt_resource(), "warehouse": WarehouseResource()},
        selection=selection,
    )


def audience_names(conn: psycopg.Connection) -> list[str]:
    return [
        name for (name,) in conn.execute("SELECT DISTINCT audience FROM audiences.audience_catalog")
    ]


def row_versions(conn: psycopg.Connection, tenant_id: str) -> dict[str, dict[str, str]]:
    """Each audience's rows of the tenant, customer key -> physical version: a rewritten row
    has a new one."""
    return {
        audience: dict(
            conn.execute(
                f"SELECT customer_key, ctid::text || xmin::text FROM audiences.{audience}"
                " WHERE tenant_id = %s",
                (tenant_id,),
            ).fetchall()
        )
        for audience in audience_names(conn)
    }


def audience_rows(conn: psycopg.Connection, tenant_id: str, audiences: list[str]) -> dict:
    """Each audience's rows of the tenant, whole, in a fixed order."""
    return {
        audience: [
            row
            for (row,) in conn.execute(
                f"SELECT to_jsonb(a)::text FROM audiences.{audience} a WHERE tenant_id = %s"
                " ORDER BY customer_key",
                (tenant_id,),
            )
        ]
        for audience in audiences
    }


def promote_to_champion(conn: psycopg.Connection, tenant_id: str) -> str:
    """A customer of another segment made a Champion in the marts; their key."""
    (key,) = conn.execute(
        "SELECT min(customer_key) FROM marts.rfm_segments"
        " WHERE tenant_id = %s AND segment <> 'Champions'",
        (tenant_id,),
    ).fetchone()
    conn.execute(
        "UPDATE marts.rfm_segments SET segment = 'Champions'"
        " WHERE tenant_id = %s AND customer_key = %s",
        (tenant_id, key),
    )
    conn.commit()
    return key


def champions(conn: psycopg.Connection, tenant_id: str) -> set[str]:
    rows = conn.execute(
        f"SELECT customer_key FROM audiences.{CHAMPIONS} WHERE tenant_id = %s", (tenant_id,)
    )
    return {key for (key,) in rows}


def test_a_tenants_refresh_replaces_its_rows_and_leaves_other_tenants_untouched(
    built, conn, instance
):
    others = row_versions(conn, "per_b")
    assert sum(map(len, others.values())) > 0
    mine = row_versions(conn, "per_a")
    promoted = promote_to_champion(conn, "per_a")
    assert promoted not in champions(conn, "per_a")

    result = refresh(instance, "per_a")
    assert result.success
    assert promoted in champions(conn, "per_a")
    assert row_versions(conn, "per_b") == others
    # Only what changed is written: the promoted customer joined the Champions and left their
    # old segment's audience; every other member's row is the one it was.
    after = row_versions(conn, "per_a")
    assert after[CHAMPIONS].keys() - mine[CHAMPIONS].keys() == {promoted}
    left = {audience for audience in mine if promoted in mine[audience].keys() - after[audience]}
    assert len(left) == 1 and left < {a for a in mine if a.startswith("audience_rfm_")}
    for audience, rows in mine.items():
        kept = {key: version for key, version in rows.items() if key != promoted}
        assert {key: after[audience].get(key) for key in kept} == kept, audience
    # And the rows are those a refresh into an empty tenant writes: every row inserted.
    written = audience_rows(conn, "per_a", list(mine))
    for audience in mine:
        conn.execute(f"DELETE FROM audiences.{audience} WHERE tenant_id = 'per_a'")
    conn.commit()
    assert refresh(instance, "per_a").success
    assert audience_rows(conn, "per_a", list(mine)) == written

    # The refresh says how old the source it read was, for its tenant's partition.
    (event,) = [
        e for e in result.get_asset_materialization_events() if e.asset_key.path == [CHAMPIONS]
    ]
    assert event.partition == "per_a"
    metadata = event.materialization.metadata
    (landed,) = conn.execute(
        "SELECT extract(epoch FROM max(synced_at)) FROM raw_vtex.orders WHERE tenant_id = 'per_a'"
    ).fetchone()
    assert metadata["source_landed_at"].value == pytest.approx(float(landed))
    assert "per_a" in metadata["source_freshness"].value


def test_the_previous_refresh_of_each_tenant_is_read_in_one_go(built, instance):
    catalog = dg.AssetKey("audience_catalog")
    assert refresh(instance, "per_b").success  # per_b's latest refresh is now its own run's

    def latest(tenant_id: str) -> datetime:
        (record,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=catalog, asset_partitions=[tenant_id]), limit=1
        ).records
        return datetime.fromtimestamp(record.timestamp, UTC)

    refreshed = previous_refreshes(instance, catalog, ["per_a", "per_b", "per_never"])
    assert refreshed == {"per_a": latest("per_a"), "per_b": latest("per_b"), "per_never": None}
    assert refreshed["per_a"] != refreshed["per_b"]


def test_readers_see_a_tenants_members_throughout_its_refresh(built, conn, instance, warehouse_url):
    """The refresh is held after it wrote the tenant's rows (its delete and insert are in,
    uncommitted; its first post-hook, the table's comment, waits): a reader meanwhile sees the
    tenant's old members, then the new."""
    before = champions(conn, "per_a")
    assert before
    promoted = promote_to_champion(conn, "per_a")
    outcome: dict[str, dg.ExecuteInProcessResult] = {}
    with psycopg.connect(warehouse_url) as holder:
        # Readers and writers pass this lock; the comment waits for it.
        holder.execute(f"LOCK TABLE audiences.{CHAMPIONS} IN SHARE UPDATE EXCLUSIVE MODE")
        worker = threading.Thread(
            target=lambda: outcome.update(result=refresh(instance, "per_a", CHAMPIONS))
        )
        worker.start()
        deadline = time.monotonic() + 120
        while (waiting := refresh_waiting(conn)) is None:
            assert worker.is_alive() and time.monotonic() < deadline, "the refresh never waited"
            time.sleep(0.2)
        assert holds_write_lock(conn, waiting)
        with psycopg.connect(warehouse_url, autocommit=True) as reader:
            assert {
                key
                for (key,) in reader.execute(
                    f"SELECT customer_key FROM audiences.{CHAMPIONS} WHERE tenant_id = 'per_a'"
                )
            } == before
        holder.rollback()
    worker.join(timeout=300)
    assert outcome["result"].success
    assert champions(conn, "per_a") == before | {promoted}


def refresh_waiting(conn: psycopg.Connection) -> int | None:
    """The backend waiting for a lock on the champions (the refresh's comment), if any."""
    row = conn.execute(
        "SELECT pid FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
        (f"audiences.{CHAMPIONS}",),
    ).fetchone()
    conn.commit()
    return row[0] if row else None


def holds_write_lock(conn: psycopg.Connection, pid: int) -> bool:
    """Whether backend `pid` holds the lock a write to the champions takes (its delete)."""
    (held,) = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = %s AND granted"
        " AND mode = 'RowExclusiveLock' AND relation = %s::regclass)",
        (pid, f"audiences.{CHAMPIONS}"),
    ).fetchone()
    conn.commit()
    return held
