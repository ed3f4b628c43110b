"""The analytics automation condition, evaluated tick by tick on the platform's definitions."""

import uuid

import dagster as dg
import psycopg
import pytest

from cdp_assets.definitions import defs
from cdp_assets.framework.dagster_storage import storage_config
from cdp_assets.lib.database import sqlalchemy_url, with_database
from cdp_assets.partitions import tenants

# The tenant-partitioned groups (audiences are one relation for all tenants).
SELECTION = dg.AssetSelection.groups("staging", "intermediate", "marts")


@pytest.fixture
def instance(warehouse_url):
    """An instance of its own: the evaluation covers every tenant partition the instance
    knows, and the session's has many."""
    name = f"cdp_auto_{uuid.uuid4().hex[:8]}"
    url = with_database(warehouse_url, name)
    with psycopg.connect(with_database(warehouse_url, "postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    overrides = {"storage": storage_config(sqlalchemy_url(url))}
    try:
        with dg.instance_for_test(overrides=overrides) as own:
            yield own
    finally:
        with psycopg.connect(with_database(warehouse_url, "postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def land(instance: dg.DagsterInstance, tenant: str, *assets: str, month: str = "2026-11-01"):
    for asset in assets:
        partition = f"{month}|{tenant}" if asset == "vtex_orders" else tenant
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key=asset, partition=partition)
        )


def requested(result, asset: str) -> set[str]:
    return set(result.get_requested_partitions(dg.AssetKey(asset)))


def test_analytics_runs_once_when_a_tenants_sources_are_fresh(instance):
    instance.add_dynamic_partitions(tenants.name, ["auto_full", "auto_partial"])
    # The sensor's first tick sets the baseline: updates count from there on.
    first = dg.evaluate_automation_conditions(defs, instance, asset_selection=SELECTION)
    assert "auto_full" not in requested(first, "customers")

    land(instance, "auto_full", "vtex_orders", "vtex_products", "vtex_skus", "vtex_customers")
    # Orders and catalog but no Master Data customers: the tenant's sources are incomplete.
    land(instance, "auto_partial", "vtex_orders", "vtex_products", "vtex_skus")
    second = dg.evaluate_automation_conditions(
        defs, instance, asset_selection=SELECTION, cursor=first.cursor
    )
    # The whole chain in one tick, history months missing notwithstanding.
    for model in ("stg_vtex__orders", "customers", "rfm_segments", "customer_predictions"):
        assert "auto_full" in requested(second, model), model
    assert "auto_partial" not in requested(second, "customers")
    assert "auto_partial" not in requested(second, "int_identity__customer_keys")

    third = dg.evaluate_automation_conditions(
        defs, instance, asset_selection=SELECTION, cursor=second.cursor
    )
    assert "auto_full" not in requested(third, "customers")  # handled: not requested again
