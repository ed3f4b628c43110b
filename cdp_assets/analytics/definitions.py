import dagster as dg

from cdp_assets.analytics.assets import (
    clv_scorecard,
    customer_predictions,
    dbt_audiences,
    dbt_churn_holdout,
    dbt_holdout_summary,
    dbt_tenant_models,
    dbt_tenant_scoring,
    holdout_predictions,
)
from cdp_assets.analytics.checks import audience_sizes_within_bounds
from cdp_assets.analytics.dbt_project import dbt_resource
from cdp_assets.analytics.jobs import (
    analytics_tenant_refresh,
    audiences_refresh,
    churn_holdout_refresh,
    tenant_changes_refresh,
)
from cdp_assets.analytics.schedules import audiences_every_48_hours, churn_holdout_weekly
from cdp_assets.analytics.sensors import analytics_automation_sensor, feed_changes_sensor


def defs() -> dg.Definitions:
    return dg.Definitions(
        assets=[
            dbt_tenant_models,
            customer_predictions,
            dbt_tenant_scoring,
            dbt_holdout_summary,
            holdout_predictions,
            dbt_churn_holdout,
            clv_scorecard,
            dbt_audiences,
        ],
        asset_checks=[audience_sizes_within_bounds],
        jobs=[
            analytics_tenant_refresh,
            churn_holdout_refresh,
            audiences_refresh,
            tenant_changes_refresh,
        ],
        schedules=[audiences_every_48_hours, churn_holdout_weekly],
        sensors=[analytics_automation_sensor, feed_changes_sensor],
        resources={"dbt": dbt_resource()},
    )
