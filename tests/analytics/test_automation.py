"""The analytics automation condition, evaluated tick by tick on the platform's definitions."""

import time
import uuid

import dagster as dg
import psycopg
import pytest
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
from dagster._core.events.log import EventLogEntry

from cdp_assets.analytics.feed_changes import changes_requests
from cdp_assets.analytics.jobs import CHANGES_JOB
from cdp_assets.analytics.sensors import ANALYTICS_GROUPS
from cdp_assets.definitions import defs
from cdp_assets.framework.dagster_storage import storage_config
from cdp_assets.lib.database import sqlalchemy_url, with_database
from cdp_assets.partitions import tenants
from cdp_assets.tenants.registry import Tenant

# The tenant-partitioned groups (audiences are one relation for all tenants).
SELECTION = dg.AssetSelection.groups("staging", "intermediate", "marts")
# What the automation sensor evaluates.
AUTOMATED = dg.AssetSelection.groups(*ANALYTICS_GROUPS)


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


def updated_in_run(instance: dg.DagsterInstance, run: dg.DagsterRun, asset: str, tenant: str):
    """A materialization of `asset` for `tenant`, recorded by `run`."""
    materialization = dg.AssetMaterialization(asset_key=asset, partition=tenant)
    instance.handle_new_event(
        EventLogEntry(
            error_info=None,
            level="debug",
            user_message="",
            run_id=run.run_id,
            timestamp=time.time(),
            dagster_event=DagsterEvent(
                DagsterEventType.ASSET_MATERIALIZATION.value,
                run.job_name,
                event_specific_data=StepMaterializationData(materialization),
            ),
        )
    )


def test_automation_requests_nothing_a_chain_refresh_planned(instance):
    instance.add_dynamic_partitions(tenants.name, ["auto_chain"])
    tenant = Tenant("auto_chain", "autochain", "VTEX_APP_KEY", "VTEX_APP_TOKEN")
    (request,) = changes_requests({"auto_chain"}, [tenant], ["auto_chain"], "landed-1")
    refresh = instance.create_run_for_job(
        defs.resolve_job_def(CHANGES_JOB),
        run_id=str(uuid.uuid4()),
        tags=request.tags,
        asset_selection=frozenset(request.asset_selection or ()),
        status=dg.DagsterRunStatus.SUCCESS,
    )
    catalog_parents = defs.resolve_asset_graph().get(dg.AssetKey("audience_catalog")).parent_keys
    first = dg.evaluate_automation_conditions(defs, instance, asset_selection=AUTOMATED)
    for asset in ("int_customers__purchase_summary", "customer_predictions", "customers"):
        updated_in_run(instance, refresh, asset, "auto_chain")
    for parent in catalog_parents:
        updated_in_run(instance, refresh, parent.to_user_string(), "auto_chain")
    updated_in_run(instance, refresh, "audience_catalog", "auto_chain")
    second = dg.evaluate_automation_conditions(
        defs, instance, asset_selection=AUTOMATED, cursor=first.cursor
    )
    assert "auto_chain" not in requested(second, "customer_predictions")
    assert "auto_chain" not in requested(second, "audience_catalog")
    # The daemon does not always see a run's updates on the tick they were made in: in a
    # benchmark, a tick saw a model's parent updated after the tick before had seen the model's
    # own update, and requested the model again. A parent's update by a run that planned the
    # model is never a reason for another run of it.
    updated_in_run(instance, refresh, "int_customers__purchase_summary", "auto_chain")
    updated_in_run(instance, refresh, "customers", "auto_chain")
    third = dg.evaluate_automation_conditions(
        defs, instance, asset_selection=AUTOMATED, cursor=second.cursor
    )
    assert "auto_chain" not in requested(third, "customer_predictions")
    assert "auto_chain" not in requested(third, "audience_catalog")
