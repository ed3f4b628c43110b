"""The analytics' sensors: the declarative automation of each tenant's models and fits
(automation.py), and the refresh after the orders feed's drains landed orders
(feed_changes.py)."""

import dagster as dg

from cdp_assets.analytics.feed_changes import (
    FeedChanges,
    changes_requests,
    due_tenants,
    read_landings,
)
from cdp_assets.analytics.jobs import CHANGES_JOB, tenant_changes_refresh, tenants_in_flight
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.tenants.runs import tenants_with_partitions

ANALYTICS_GROUPS = ("staging", "intermediate", "marts", "audiences")

analytics_automation_sensor = dg.AutomationConditionSensorDefinition(
    "analytics_automation_sensor",
    target=dg.AssetSelection.groups(*ANALYTICS_GROUPS),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=60,
    description="Every minute, requests the analytics of each tenant whose sources are fresh and"
    " complete: its dbt models, CLV fit and churn scoring run once a source was updated since"
    " they last ran, nothing upstream is running or failed, and its catalog and customers"
    " exist (order months may be missing: history not loaded). The weekly churn holdout is"
    " left to its schedule.",
)


@dg.sensor(
    job=tenant_changes_refresh,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every 30 seconds, after orders feed drains that landed orders: one refresh of"
    " analytics and audiences per block of neighbouring tenants concerned. A tenant with a"
    " refresh queued waits for it (it reads the new orders when it starts), one with a refresh"
    " running gets the next when it ends: a burst of events is one refresh per tenant.",
)
def feed_changes_sensor(
    context: dg.SensorEvaluationContext, warehouse: WarehouseResource
) -> dg.SensorResult:
    changes = FeedChanges.parse(context.cursor)
    read_landings(context.instance, changes)
    tenant_rows, order = tenants_with_partitions(context, warehouse)
    queued, started = tenants_in_flight(context.instance, CHANGES_JOB, order)
    due, waiting = due_tenants(changes.pending, queued, started)
    requests = changes_requests(due, tenant_rows, order, f"landed-{changes.after_storage_id}")
    changes.pending = waiting
    skip = None if requests else f"no landed orders await a refresh ({len(waiting)} running)"
    return dg.SensorResult(
        run_requests=requests,
        cursor=changes.serialize(),
        skip_reason=skip,
    )
