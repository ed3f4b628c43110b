"""The analytics automation condition, evaluated tick by tick on the platform's definitions."""

import time
import uuid

import dagster as dg
import psycopg
import pytest

from cdp_assets.analytics.feed_changes import changes_requests
from cdp_assets.analytics.jobs import ANALYTICS_JOB, CHANGES_JOB
from cdp_assets.analytics.sensors import ANALYTICS_GROUPS
from cdp_assets.definitions import defs
from cdp_assets.framework.dagster_storage import storage_config
from cdp_assets.lib.database import sqlalchemy_url, with_database
from cdp_assets.partitions import tenants
from cdp_assets.tenants.registry import Tenant
from cdp_devkit.bench.fleet import materialization_event

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
    instance.handle_new_event(
        materialization_event(dg.AssetKey(asset), tenant, time.time(), run.run_id, run.job_name)
    )


def finished_run(
    instance: dg.DagsterInstance, job_name: str, request: dg.RunRequest
) -> dg.DagsterRun:
    """A run of `job_name` for `request`, finished, tagged as the sensor daemon tags it: the
    job's tags, then the request's."""
    job = defs.resolve_job_def(job_name)
    return instance.create_run_for_job(
        job,
        run_id=str(uuid.uuid4()),
        tags={**job.run_tags, **request.tags},
        status=dg.DagsterRunStatus.SUCCESS,
    )


def test_automation_requests_nothing_a_chain_refresh_made_over_a_range_of_tenants(instance):
    tenant_ids = ["auto_chain_a", "auto_chain_b"]
    instance.add_dynamic_partitions(tenants.name, tenant_ids)
    rows = [Tenant(t, t.replace("_", ""), "VTEX_APP_KEY", "VTEX_APP_TOKEN") for t in tenant_ids]
    (request,) = changes_requests(set(tenant_ids), rows, tenant_ids, "landed-1")
    refresh = finished_run(instance, CHANGES_JOB, request)
    catalog_parents = defs.resolve_asset_graph().get(dg.AssetKey("audience_catalog")).parent_keys
    first = dg.evaluate_automation_conditions(defs, instance, asset_selection=AUTOMATED)
    for tenant in tenant_ids:
        for asset in ("int_customers__purchase_summary", "customer_predictions", "customers"):
            updated_in_run(instance, refresh, asset, tenant)
        for parent in catalog_parents:
            updated_in_run(instance, refresh, parent.to_user_string(), tenant)
        updated_in_run(instance, refresh, "audience_catalog", tenant)
    second = dg.evaluate_automation_conditions(
        defs, instance, asset_selection=AUTOMATED, cursor=first.cursor
    )
    # The daemon does not always see a run's updates on the tick they were made in: in a
    # benchmark, ticks saw parents updated after the tick before had seen their children
    # updated, and requested the children of 40 tenants again. A parent's update by a run that
    # refreshed its children too is never a reason for another run of them.
    for tenant in tenant_ids:
        updated_in_run(instance, refresh, "int_customers__purchase_summary", tenant)
        updated_in_run(instance, refresh, "customers", tenant)
    third = dg.evaluate_automation_conditions(
        defs, instance, asset_selection=AUTOMATED, cursor=second.cursor
    )
    for result in (second, third):
        for asset in ("customer_predictions", "audience_catalog"):
            assert not requested(result, asset) & set(tenant_ids), asset

    # A run that refreshed the parents alone (a sync's analytics refresh, without the
    # audiences) is followed by the automation.
    alone = finished_run(instance, ANALYTICS_JOB, request)
    for tenant in tenant_ids:
        updated_in_run(instance, alone, "customers", tenant)
    fourth = dg.evaluate_automation_conditions(
        defs, instance, asset_selection=AUTOMATED, cursor=third.cursor
    )
    assert requested(fourth, "audience_catalog") >= set(tenant_ids)
