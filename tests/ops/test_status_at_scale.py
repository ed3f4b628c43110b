"""`cdp status` over many tenants: judged from a row per tenant partition that each call brings
up to date from the event log past its cursor, filtered to the tenants asked about in the
database; a summary by default above 20 tenants, every row with --all."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import dagster as dg
import psycopg
import pytest
from click.testing import CliRunner
from support import daemon_alive

from cdp_assets.cli import main
from cdp_assets.framework.dagster_storage import storage_config
from cdp_assets.lib.database import sqlalchemy_url, with_database
from cdp_assets.lib.migrations import migrated_url
from cdp_assets.ops.status import collect_status, watched_assets
from cdp_assets.partitions import tenant_months, tenants
from cdp_assets.tenants.registry import Tenant, add_tenant

TENANTS = [f"fleet_{i:02d}" for i in range(30)]
FAILING = TENANTS[7:10]
NEVER_SYNCED = TENANTS[-1]


class CatalogUnavailable(RuntimeError):
    pass


# Named like the platform's asset: the event log (and so the verdict) knows assets by key.
@dg.asset(name="vtex_skus", partitions_def=tenants)
def failing_skus() -> None:
    raise CatalogUnavailable("VTEX answered 503 until the retries ran out")


@dg.asset(name="vtex_orders", partitions_def=tenant_months)
def failing_orders() -> None:
    raise CatalogUnavailable("VTEX answered 503 until the retries ran out")


def _partition(key: dg.AssetKey, tenant: str, month: str = "2025-01-01") -> str:
    return f"{month}|{tenant}" if key.path == ["vtex_orders"] else tenant


@pytest.fixture(scope="module")
def fleet(warehouse_url: str) -> Iterator[tuple[str, dg.DagsterInstance]]:
    """A warehouse and a Dagster instance of their own with 30 active tenants, all fresh but
    one never synced and three whose SKU sync then failed."""
    name = f"cdp_fleet_{uuid.uuid4().hex[:8]}"
    url = migrated_url(with_database(warehouse_url, name))
    overrides = {"storage": storage_config(sqlalchemy_url(url)), "telemetry": {"enabled": False}}
    try:
        with dg.instance_for_test(overrides=overrides) as instance:
            with psycopg.connect(url) as conn:
                for tenant in TENANTS:
                    add_tenant(conn, Tenant(tenant, tenant.replace("_", ""), "FLEET_KEY", "TOK"))
            instance.add_dynamic_partitions(tenants.name, TENANTS)
            for tenant in TENANTS[:-1]:
                for keys in watched_assets().values():
                    for key in keys:
                        event = dg.AssetMaterialization(key, partition=_partition(key, tenant))
                        instance.report_runless_asset_event(event)
            for tenant in FAILING:
                failed = dg.materialize(
                    [failing_skus], instance=instance, partition_key=tenant, raise_on_error=False
                )
                assert not failed.success
            daemon_alive(instance)
            instance.report_runless_asset_event(dg.AssetMaterialization("operations_metrics"))
            yield url, instance
    finally:
        with psycopg.connect(with_database(warehouse_url, "postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _status(instance: dg.DagsterInstance, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["status", *args], obj={"dagster_instance": instance})
    return result.exit_code, result.output


def test_many_tenants_are_summarized_by_state_with_the_worst_named(fleet, monkeypatch):
    url, instance = fleet
    monkeypatch.setenv("DATABASE_URL", url)
    code, text = _status(instance)
    assert code == 0, text
    watched = len(watched_assets())
    assert f"{len(TENANTS)} tenants x {watched} assets: " in text
    assert f"{watched} never" in text  # the tenant never synced, every asset
    assert f"{len(FAILING)} failed" in text
    # The tenants needing attention are named with what is wrong; the healthy ones are not.
    assert f"{NEVER_SYNCED} vtex_orders: never materialized" in text
    for tenant in FAILING:
        assert f"{tenant} vtex_skus: run " in text and "failed at" in text
    healthy = [t for t in TENANTS if t not in (*FAILING, NEVER_SYNCED)]
    assert not [t for t in healthy if t in text]

    code, everything = _status(instance, "--all")
    assert code == 0, everything
    for tenant in TENANTS:
        rows = [line for line in everything.splitlines() if line.startswith(f"{tenant} ")]
        assert len(rows) == watched, tenant


def test_the_verdict_names_the_failing_tenants_and_one_tenant_is_judged_alone(fleet, monkeypatch):
    url, instance = fleet
    monkeypatch.setenv("DATABASE_URL", url)
    code, report = _status(instance, "--check", "--json")
    assert code == 1
    problems = json.loads(report)["problems"]
    assert {p["tenant_id"] for p in problems if p["check"] == "asset"} == {
        *FAILING,
        NEVER_SYNCED,
    }
    assert {p["subject"] for p in problems if p["tenant_id"] in FAILING} >= {"vtex_skus"}

    code, alone = _status(instance, "--check", "--json", "--tenant", TENANTS[0])
    assert code == 0, alone
    assets = json.loads(alone)["assets"]
    assert {a["tenant_id"] for a in assets} == {TENANTS[0]}
    assert all(a["ok"] for a in assets)


def test_events_after_the_last_read_change_the_verdict(fleet, monkeypatch):
    """The state table is brought up to date at each call: a newer month of orders is the one
    judged, and a run of it that fails after it succeeded makes the tenant's orders failed."""
    url, instance = fleet
    monkeypatch.setenv("DATABASE_URL", url)
    tenant = TENANTS[3]
    orders = dg.AssetKey("vtex_orders")
    with psycopg.connect(url) as conn:
        before = collect_status(instance, conn, tenant_ids=[tenant], instigators=[])
        judged = {a.asset: a for a in before.assets}["vtex_orders"]
        assert judged.partition_key == _partition(orders, tenant)

        newer = _partition(orders, tenant, "2025-02-01")
        instance.report_runless_asset_event(dg.AssetMaterialization(orders, partition=newer))
        after = collect_status(instance, conn, tenant_ids=[tenant], instigators=[])
        judged = {a.asset: a for a in after.assets}["vtex_orders"]
        assert judged.partition_key == newer and judged.ok

        failed = dg.materialize(
            [failing_orders], instance=instance, partition_key=newer, raise_on_error=False
        )
        assert not failed.success
        last = collect_status(instance, conn, tenant_ids=[tenant], instigators=[])
        judged = {a.asset: a for a in last.assets}["vtex_orders"]
        assert judged.partition_key == newer
        assert judged.failed_run_id == failed.run_id and judged.state == "failed"

    # Another instance on the same warehouse has its own event log: none of this is its state.
    with dg.instance_for_test() as other, psycopg.connect(url) as conn:
        elsewhere = collect_status(other, conn, tenant_ids=[tenant], instigators=[])
        assert {a.state for a in elsewhere.assets} == {"never"}
